"""`sparkpoint list` shows checkpoints of an abandoned lineage as superseded (invariant 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.storage import open_storage
from tests.support.records import put_checkpoint


def checkpoint(catalog: Catalog, batch: int) -> SnapshotMetadata:
    return put_checkpoint(catalog, {f"offsets/{batch}": f"offsets {batch}".encode()}, batch_id=batch,
                          created_at=1.0e9 + batch)


def test_list_marks_the_abandoned_lineage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), "orders")
    catalog.claim_generation()
    metas = [checkpoint(catalog, batch) for batch in range(3)]
    rollback = catalog.claim_generation().generation
    catalog.write_origin(new_origin(rollback, kind="checkpoint", uri=catalog.checkpoint_uri(metas[0].id),
                                    base_id=metas[0].id, snapshot_id=metas[0].id, batch_id=0, id_floor=3,
                                    restore={}, live_dir=None, host="h", pid=1))

    assert main(["list", "--dir", str(tmp_path), "--job", "orders", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["id"], e["status"], e["superseded_by"], e["valid"]) for e in doc["checkpoints"]] == [
        (3, "superseded", rollback, True), (2, "superseded", rollback, True), (1, "valid", None, True)]

    assert main(["list", "--dir", str(tmp_path), "--job", "orders"]) == 0
    lines = capsys.readouterr().out.splitlines()
    chk3 = next(line for line in lines if line.rstrip().endswith(f"superseded (generation {rollback})"))
    assert "/chk-3" in chk3
