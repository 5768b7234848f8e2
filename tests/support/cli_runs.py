"""The `sparkpoint` command run in process (`run`) on a job whose catalog has
checkpoints (`job_with_checkpoints`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata, SnapshotStats, sha256_hex
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.storage import open_storage

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
    refs = []
    for path, data in files.items():
        key = catalog.shared_key(path, sha256_hex(data))
        catalog.store.put(key, data)
        refs.append(FileRef(path, key, len(data), sha256_hex(data)))
    meta = SnapshotMetadata("checkpoint", catalog.next_checkpoint_id(), catalog.job, catalog.current_generation(),
                            version, time.time(), tuple(refs), stats=SnapshotStats(12, 100, 1, 502, 2))
    catalog.complete_checkpoint(meta)
    return meta


def job_with_checkpoints(root: Path, count: int = 2) -> tuple[Catalog, list[SnapshotMetadata]]:
    """Job ``orders`` under `root`, generation 1 claimed, with `count` `checkpoint`s."""
    catalog = Catalog(open_storage(str(root)), "orders")
    catalog.claim_generation()
    return catalog, [checkpoint(catalog, v) for v in range(count)]
