"""The `sparkpoint` command run in process (`run`) on a job whose catalog has
checkpoints (`job_with_checkpoints`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, SnapshotStats
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.storage import open_storage
from tests.support.records import put_checkpoint

__all__ = ["checkpoint", "job_with_checkpoints", "run"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`sparkpoint ARGV...` in process: its exit code, stdout and stderr (never a traceback)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def checkpoint(catalog: Catalog, version: int) -> SnapshotMetadata:
    """A completed checkpoint of batch `version`: its offsets and one state file that every
    checkpoint shares; 12 ms, 100 bytes copied, 2 files."""
    files = {f"offsets/{version}": f"o{version}".encode(), "state/0/0/1.delta": b"state" * 100}
    return put_checkpoint(catalog, files, batch_id=version, stats=SnapshotStats(12, 100, 1, 502, 2))


def job_with_checkpoints(root: Path, count: int = 2) -> tuple[Catalog, list[SnapshotMetadata]]:
    """Job ``orders`` under `root`, generation 1 claimed, with `count` `checkpoint`s."""
    catalog = Catalog(open_storage(str(root)), "orders")
    catalog.claim_generation()
    return catalog, [checkpoint(catalog, v) for v in range(count)]
