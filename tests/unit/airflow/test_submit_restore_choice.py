"""Which snapshot a try restores: `restore` first, then the latest checkpoint of this task's runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def add_checkpoint(catalog: Catalog, batch: int) -> SnapshotMetadata:
    generation = catalog.claim_generation().generation
    meta = SnapshotMetadata(kind="checkpoint", id=catalog.next_checkpoint_id(), job="orders", generation=generation,
                            batch_id=batch, created_at=time.time(), files=())
    catalog.complete_checkpoint(meta)
    return meta


def operator(root: Path, restore: str):
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="t", application="job.py", job_name="orders", checkpoint_dir=str(root),
                                    restore=restore)


def test_first_try_uses_restore_and_retries_resume_from_latest(tmp_path):
    catalog = Catalog.open(str(tmp_path), "orders")
    assert operator(tmp_path, "none").choose_restore(1, catalog) == "none"
    assert operator(tmp_path, "none").choose_restore(2, catalog) == "latest"
    assert operator(tmp_path, "latest").choose_restore(3, catalog) == "latest"


def test_retry_of_a_savepoint_restore_without_a_newer_checkpoint_restores_the_savepoint_again(tmp_path):
    catalog = Catalog.open(str(tmp_path), "orders")
    old = add_checkpoint(catalog, 5)  # e.g. green's, older state of another code version
    time.sleep(0.01)
    savepoint = catalog.create_savepoint(catalog.handle(old)).uri
    op = operator(tmp_path, savepoint)
    assert op.choose_restore(1, catalog) == savepoint
    assert op.choose_restore(2, catalog) == savepoint, "no checkpoint of the first try exists yet"
    time.sleep(0.01)
    add_checkpoint(catalog, 6)  # the first try got this far
    assert op.choose_restore(2, catalog) == "latest"
