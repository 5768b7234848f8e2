"""Which snapshot a try restores: `restore` first, then the latest checkpoint of this task's runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata
from tests.support.records import checkpoint_at

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def add_checkpoint(catalog: Catalog, batch: int) -> SnapshotMetadata:
    """A checkpoint of `batch` by a newly claimed generation."""
    return checkpoint_at(catalog, batch, generation=catalog.claim_generation().generation)


def operator(root: Path, restore: str):
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="t", application="job.py", job_name="orders",
                                    checkpoint_dir=str(root), restore=restore)


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


def test_a_hand_chosen_restore_snapshot_is_honoured_on_every_try(tmp_path):
    """`restore=` is for the first try (a retry resumes); `restore_snapshot=` is restored on
    every try, a retry and a clear included (issue #30: restore a chosen snapshot by hand)."""
    from airflow_sparkpoint.exceptions import ConfigError
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    catalog = Catalog.open(str(tmp_path), "orders")
    savepoint = catalog.create_savepoint(catalog.handle(add_checkpoint(catalog, 5))).uri
    add_checkpoint(catalog, 6)
    add_checkpoint(catalog, 7)  # the task's own tries got further: `restore=` would resume
    op = SparkpointSubmitOperator(task_id="t", application="job.py", job_name="orders",
                                  checkpoint_dir=str(tmp_path), restore_snapshot="{{ params.restore }}")
    op.render_template_fields({"params": {"restore": savepoint}})
    assert [op.choose_restore(n, catalog, [2, 3]) for n in (1, 2, 5)] == [savepoint] * 3
    conf = op.build_sparkpoint_conf(op.choose_restore(4, catalog, [3]))
    assert conf["spark.sparkpoint.restore"] == savepoint
    op.restore_snapshot = ""  # the DAG param left empty: not set
    assert op.choose_restore(2, catalog, [3]) == "latest"
    op.restore_snapshot = "latest"
    with pytest.raises(ConfigError, match="restore_snapshot='latest' is invalid"):
        op.choose_restore(1, catalog)


@pytest.mark.parametrize(("dag_id", "task_id"), [("example_sparkpoint_quickstart", "running_totals"),
                                                 ("example_sparkpoint_incremental_etl", "windowed_counts")])
def test_example_dags_take_a_restore_param(dag_id, task_id):
    from airflow.dag_processing.dagbag import DagBag

    repo = Path(__file__).resolve().parents[3]
    bag = DagBag(str(repo / "dags" / f"{dag_id}.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(dag_id)
    assert dag.params["restore"] == ""
    assert dag.get_task(task_id).restore_snapshot == "{{ params.restore }}"
