"""Sparkpoint jobs on a real Spark standalone cluster (a master and two workers from the
installed pyspark, executors in JVMs of their own), submitted by a real Airflow through
`SparkpointSubmitOperator` with ``master="spark://..."`` (the ``spark_cluster``
connection, registered through the REST API), client deploy mode.

* an example pipeline (``dags/jobs/keyed_totals.py``) runs on the cluster's executors;
* a worker (its JVM, its executor JVM and their Python workers) is SIGKILLed while an
  executor is in the middle of a micro-batch: Spark retries the task elsewhere, the
  driver and the Airflow try live on, and the output is exact;
* the driver is SIGKILLed: the Airflow retry resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import SparkCluster
from tests.e2e.scenarios import driver_sigkill_then_retry
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import EXAMPLE_JOBS, Totals
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAG = "e2e_cluster"
MARKER = "pause-here"  # e2e_totals.py's MARKER: the executor reading this user pauses


@pytest.fixture(scope="module")
def cluster(airflow_api: AirflowApi, spark_cluster: SparkCluster) -> Iterator[SparkCluster]:
    airflow_api.create_connection("spark_cluster", "spark", host="spark://127.0.0.1", port=spark_cluster.port,
                                  extra=json.dumps({"deploy-mode": "client"}))
    yield spark_cluster


def executor_dirs(cluster: SparkCluster, application_id: str) -> list[Path]:
    """The executors' work directories a worker made for the application."""
    return sorted(p for worker in cluster.worker_procs
                  for p in (cluster.base / worker / application_id).glob("*"))


# slow (64 s): the default run has the same pipeline on this cluster through Airflow, exact, in
# test_a_worker_killed_mid_batch_is_retried_by_spark_and_the_output_is_exact
@pytest.mark.slow
def test_example_pipeline_runs_on_the_standalone_cluster(
    airflow_api: AirflowApi, cluster: SparkCluster, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "cluster_keyed")
    pipeline.write_many(3)
    run = airflow_api.trigger(DAG, pipeline.params(script=str(EXAMPLE_JOBS / "keyed_totals.py"), version=1))
    airflow_api.wait_task(DAG, run, "job", {"success"}, timeout=900)
    result = airflow_api.xcom(DAG, run, "job")
    assert result["status"] == "finished" and result["last_batch"] == 2, result
    application_id = pipeline.status()["application_id"]
    assert application_id.startswith("app-"), f"not a standalone application: {application_id}"
    assert executor_dirs(cluster, application_id), f"no executor of {application_id} ran on a worker"
    rows = {r["user"]: (int(r["total"]), int(r["events"]), int(r["code_version"]))
            for r in pipeline_rows(pipeline)}
    assert rows == {user: (total, events, 1) for user, (total, events) in pipeline.expected().items()}


def pipeline_rows(pipeline: Totals) -> list[dict]:
    from airflow_sparkpoint.demo.support import delta_rows

    rows = delta_rows(pipeline.output)
    assert len({r["user"] for r in rows}) == len(rows), rows
    return rows


def test_a_worker_killed_mid_batch_is_retried_by_spark_and_the_output_is_exact(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, cluster: SparkCluster, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "lost_worker")
    pipeline.write_many(2)
    pipeline.write([("u0", 5), (MARKER, 7), ("u1", 3)])  # batch 2: its executor task pauses
    pipeline.write_many(1)
    run = airflow_api.trigger(DAG, pipeline.params(executor_pause_dir=str(pipeline.pauses)))
    reached_file = pipeline.pauses / "executor.reached"
    wait_for("an executor to pause in batch 2", reached_file.exists, 900,
             lambda: airflow_api.describe(DAG, run))
    paused = json.loads(reached_file.read_text())
    [worker] = [name for name in cluster.worker_procs
                if paused["pid"] in {p.pid for p in cluster.worker_tree(name)}]
    executors = cluster.executors(worker)
    assert executors, f"no executor JVM under {worker}"
    killed = cluster.kill_worker(worker)
    assert paused["pid"] in {p.pid for p in killed} and {e.pid for e in executors} <= {p.pid for p in killed}
    try:
        wait_for(f"the master to see {worker} dead", lambda: len(cluster.alive_workers()) == 1, 180)
        airflow_api.wait_task(DAG, run, "job", {"success"}, timeout=900)
        tries = airflow_api.tries(DAG, run, "job")
        assert [t["state"] for t in tries] == ["success"], f"Airflow retried: {tries}"  # Spark did
        result = airflow_api.xcom(DAG, run, "job")
        assert result["status"] == "finished" and result["generation"] == 1 and result["last_batch"] == 3, \
            result
        assert result["first_batch"] == 0 and result["batches_processed"] == 4, result
        log = airflow_api.log(DAG, run, "job", 1)
        assert "Lost executor" in log or "ExecutorLostFailure" in log or "lost" in log.lower(), log[-3000:]
        pipeline.assert_exact()
    finally:
        cluster.start_worker(worker)
        cluster.wait_workers(2)


@pytest.mark.slow  # the local twin (test_e2e_kills.py) runs by default: `make test-e2e` / `make test-all`
def test_driver_sigkilled_on_the_cluster_then_the_airflow_retry_resumes(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, cluster: SparkCluster, tmp_path: Path
) -> None:
    driver_sigkill_then_retry(airflow_api, airflow_stack, tmp_path, DAG)
