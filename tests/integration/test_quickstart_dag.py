"""The walking skeleton's proof: the quickstart DAG, through real spark-submit, loses
its driver to SIGKILL after K of M micro-batches; Airflow's retry resumes from the
latest completed checkpoint and the Delta table ends exactly right."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import expected_totals, write_event_files

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
M = 6  # micro-batches: one input file each
K = 2  # the first try's driver dies once batch K is confirmed, before its checkpoint


def test_retry_resumes_from_latest_checkpoint_with_exact_output(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from deltalake import DeltaTable

    from airflow_sparkpoint.checkpoints import Catalog

    base = tmp_path / "quickstart"
    rows = write_event_files(base / "input", files=M, users=3)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("SPARKPOINT_TEST_FAULT", f"confirmed:{K}")
    monkeypatch.setenv("SPARKPOINT_TEST_FAULT_ONCE", str(tmp_path / "fault-fired"))

    dag = DagBag(str(REPO / "dags")).get_dag("example_sparkpoint_quickstart")
    assert dag is not None
    run = dag.test(run_conf={"base_dir": str(base)})

    assert (tmp_path / "fault-fired").exists(), "the first try was not killed"
    (ti,) = run.get_task_instances()
    assert run.state == "success"
    assert ti.try_number == 2, "the task should have succeeded on its retry"

    table = DeltaTable(str(base / "output"))
    got = {r["user"]: (r["total"], r["events"]) for r in table.to_pyarrow_table().to_pylist()}
    assert got == expected_totals(rows)
    assert table.transaction_version("quickstart") == M - 1

    catalog = Catalog.open(str(base / "checkpoints"), "quickstart")
    assert catalog.current_generation() == 2
    result = json.loads(catalog.store.get("results/000000000002.json"))
    assert result["status"] == "finished"
    assert result["restore_mode"] == "snapshot"
    # It resumed: batches up to the last checkpoint of the first try were not re-run.
    assert result["first_batch"] == K
    assert result["batches_processed"] == M - K < M
    assert not os.listdir(base / "output" / "_sparkpoint_txn" / "quickstart"), "staged output left behind"
