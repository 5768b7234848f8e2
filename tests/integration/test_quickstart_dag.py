"""The walking skeleton's proof: the quickstart DAG, through real spark-submit, loses
its driver to SIGKILL after K of M micro-batches; Airflow's retry resumes from the
latest completed checkpoint and the Delta table ends exactly right. The killed driver's
RocksDB native library was extracted into its submission directory, which the task
removed (`airflow_sparkpoint.services.submit_dir`), not left in ``/tmp``."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.inputs import expected_totals, write_event_files
from tests.support.paths import REPO

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

M = 6  # micro-batches: one input file each
K = 2  # the first try's driver dies once batch K is confirmed, before its checkpoint


def test_retry_resumes_from_latest_checkpoint_with_exact_output(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from deltalake import DeltaTable

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.services.submit_dir import SubmitDir

    closed: list[tuple[str, list[str]]] = []  # (submission directory, its native directory) at close
    real_close = SubmitDir.close

    def close(self: SubmitDir) -> None:
        closed.append((self.path, sorted(os.listdir(self.native_dir)) if os.path.isdir(self.native_dir)
                       else []))
        real_close(self)

    monkeypatch.setattr(SubmitDir, "close", close)
    monkeypatch.delenv("ROCKSDB_SHAREDLIB_DIR", raising=False)
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

    # Each try had its own submission directory; the SIGKILLed JVM's library was in the
    # first (a clean exit deletes its own), and the task removed both.
    assert len(closed) == 2 and closed[0][0] != closed[1][0], closed
    assert [n for n in closed[0][1] if n.startswith("librocksdbjni")], f"not extracted there: {closed[0]}"
    assert not any(os.path.exists(path) for path, _names in closed)
