"""DAGs of the end-to-end tests (``tests/e2e``), parsed by the real dag-processor.

Everything a test varies comes in through the run's conf (DAG params): job name, paths,
trigger, the job script, pause points. Retries, connections and the detached-driver
wrapper are per DAG (they are not templated fields):

- ``e2e_submit``: one `SparkpointSubmitOperator` on ``spark_default`` (``local[2]``),
  two retries one second apart (the driver-kill tests); its ``fault`` param arms
  ``SPARKPOINT_TEST_FAULT`` (`airflow_sparkpoint.faults`) in the driver of try
  ``fault_try`` only.
- ``e2e_stream``: the same with no retry (a long-running streaming task that a test
  marks failed, clears or stops).
- ``e2e_detached``: like ``e2e_stream``, but ``spark-submit`` is started through a
  wrapper that puts the driver in a session of its own, out of reach of the task
  supervisor's process-group kill: a driver that outlives its task the way a
  cluster-mode driver (or one on a lost worker host) does.
- ``e2e_deferred``: like ``e2e_stream`` with ``deferrable=True`` (issue #50): the driver
  runs detached and the task defers to `SparkpointRunTrigger`.
- ``e2e_stop``: `SparkpointSavepointOperator(stop=True)` on a job (a stop-with-savepoint).
- ``e2e_cluster``: on ``spark_cluster`` (a Spark standalone master the test registers
  through the REST API), two retries.
- ``e2e_cluster_mode``: on ``spark_fake_cluster``, a Spark connection in cluster deploy
  mode whose ``spark2-submit`` is the fake cluster manager of ``tests/e2e/fakes``.
- ``e2e_sensor``: a deferrable `SparkpointCheckpointSensor` (3 checkpoints of a generation).
- ``e2e_on_commits``: scheduled on the Delta table of job ``e2e_watched`` (in the
  ``sparkpoint_default`` store, the table at ``<stack home>/watched-table``) through an
  `AssetWatcher` with `SparkpointCommitTrigger`; its task returns the payloads of the
  events that triggered its run.
- ``e2e_on_deployed_commits`` and ``e2e_deploy_on_savepoint``: the same for job
  ``e2e_deployed`` (its table at ``<stack home>/deployed-table``), and a DAG scheduled on
  that job's savepoints (`SparkpointSavepointTrigger`, the store named by its root
  ``<stack home>/sparkpoint``) whose task returns the events' extras (the savepoint URI a
  deploy would restore).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, AssetWatcher, Param, task

from airflow_sparkpoint.assets import savepoints_asset, sink_asset
from airflow_sparkpoint.operators import SparkpointSavepointOperator, SparkpointSubmitOperator
from airflow_sparkpoint.sensors import SparkpointCheckpointSensor
from airflow_sparkpoint.triggers import SparkpointCommitTrigger, SparkpointSavepointTrigger

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "jobs" / "e2e_totals.py")
WRAPPERS = HERE / "wrappers"
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.log.level": "WARN",
    "spark.driver.host": "127.0.0.1",
    "spark.executor.memory": "512m",
    # An executor lost with its worker is retried elsewhere; a stage retried too often fails.
    "spark.task.maxFailures": "4",
}


def _params() -> dict[str, Param]:
    return {
        "job_name": Param("e2e", type="string"),
        "script": Param(JOB, type="string", description="the PySpark job to submit"),
        "input": Param("/nonexistent/input", type="string"),
        "output": Param("/nonexistent/output", type="string"),
        "checkpoint_dir": Param("/nonexistent/checkpoints", type="string"),
        "trigger": Param("availableNow", type="string"),
        "retry_trigger": Param("", type="string",
                               description="the trigger of tries after the first (default: trigger)"),
        "restore": Param("latest", type="string"),
        "files_per_batch": Param(1, type="integer"),
        "version": Param(1, type="integer", description="keyed_totals.py's --version"),
        "poll_interval": Param("0.5s", type="string", description="control.pollInterval"),
        "num_retained": Param("3", type="string", description="checkpoint.numRetained"),
        "pause_at": Param("", type="string", description="test.pauseAt of the FIRST try only"),
        "pause_dir": Param("", type="string"),
        "executor_pause_dir": Param("", type="string"),
        "fault": Param("", type="string", description="SPARKPOINT_TEST_FAULT of try fault_try (e2e_submit)"),
        "fault_try": Param(0, type="integer"),
    }


def _submit(conn_id: str, **kwargs: Any) -> SparkpointSubmitOperator:
    return SparkpointSubmitOperator(
        task_id="job",
        conn_id=conn_id,
        application="{{ params.script }}",
        application_args=[
            "--input={{ params.input }}",
            "--output={{ params.output }}",
            "--files-per-batch={{ params.files_per_batch }}",
            "--version={{ params.version }}",
            "--executor-pause-dir={{ params.executor_pause_dir }}",
        ],
        conf=dict(SPARK_CONF),
        job_name="{{ params.job_name }}",
        checkpoint_dir="{{ params.checkpoint_dir }}",
        restore="{{ params.restore }}",
        trigger="{{ params.retry_trigger if ti.try_number > 1 and params.retry_trigger "
                "else params.trigger }}",
        sparkpoint_conf={
            "control.pollInterval": "{{ params.poll_interval }}",
            "checkpoint.numRetained": "{{ params.num_retained }}",
            "test.pauseAt": "{{ params.pause_at if ti.try_number == 1 else '' }}",
            "test.pauseDir": "{{ params.pause_dir }}",
        },
        retry_delay=timedelta(seconds=1),
        **kwargs,
    )


def _dag(dag_id: str, doc: str) -> DAG:
    return DAG(dag_id=dag_id, doc_md=doc, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
               params=_params(), tags=["e2e"], max_active_runs=4)


with _dag("e2e_submit", "A checkpointed job on local[2]; a killed try is retried twice.") as submit_dag:
    _submit("spark_default", retries=2,
            env_vars={"SPARKPOINT_TEST_FAULT": ("{{ params.fault if ti.try_number == "
                                                "params.fault_try else '' }}")})

with _dag("e2e_stream", "A checkpointed (streaming) job on local[2]; no retry.") as stream_dag:
    _submit("spark_default", retries=0)

with _dag("e2e_detached", "A job whose driver outlives its task (own session).") as detached_dag:
    _submit("spark_default", retries=0,
            env_vars={"PATH": f"{WRAPPERS}{os.pathsep}{os.environ.get('PATH', os.defpath)}"})

with _dag("e2e_deferred",
          "A deferrable job: its driver runs detached, a trigger follows it.") as deferred_dag:
    _submit("spark_default", retries=0, deferrable=True)

with DAG(
    dag_id="e2e_stop",
    doc_md="Stop a running job with a savepoint (SparkpointSavepointOperator(stop=True)).",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["e2e"],
    params={"job_name": Param("e2e", type="string"), "checkpoint_dir": Param("/nonexistent", type="string")},
) as stop_dag:
    SparkpointSavepointOperator(task_id="stop", job_name="{{ params.job_name }}",
                                checkpoint_dir="{{ params.checkpoint_dir }}", stop=True, timeout=300,
                                poll_interval=1)

with _dag("e2e_cluster", "A checkpointed job on the Spark standalone cluster.") as cluster_dag:
    _submit("spark_cluster", retries=2)

with _dag("e2e_cluster_mode",
          "deploy_mode=cluster through a fake cluster manager (tests/e2e/fakes).") as mode_dag:
    _submit("spark_fake_cluster", retries=0)

with DAG(
    dag_id="e2e_sensor",
    doc_md="Wait (deferred, in the triggerer) for 3 checkpoints of a generation.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["e2e"],
    params={"job_name": Param("e2e", type="string"), "checkpoint_dir": Param("/nonexistent", type="string"),
            "generation": Param(1, type="integer")},
) as sensor_dag:
    SparkpointCheckpointSensor(
        task_id="wait",
        job_name="{{ params.job_name }}",
        checkpoint_dir="{{ params.checkpoint_dir }}",
        generation="{{ params.generation }}",
        min_checkpoints=3,
        poke_interval=1,
        timeout=900,
        max_heartbeat_age=120,
        deferrable=True,
    )

WATCHED_JOB = "e2e_watched"
#: the watched job's table: fixed per stack (the DAG file is parsed with the stack's environment)
STACK_HOME = Path(os.environ.get("SPARKPOINT_E2E_LOGS", "/nonexistent/e2e-logs")).parent
WATCHED_TABLE = STACK_HOME / "watched-table"
watched_sink = {"kind": "delta", "uri": str(WATCHED_TABLE), "mode": "merge", "keys": ["user"]}
watched_table = sink_asset(watched_sink, watchers=[
    AssetWatcher(name="e2e_watched_commits", trigger=SparkpointCommitTrigger(
        job_name=WATCHED_JOB, sparkpoint_conn_id="sparkpoint_default", poll_interval=1)),
])

def _on_asset(dag_id: str, doc: str, asset: Any) -> DAG:
    """A DAG scheduled on `asset` whose task ``seen`` returns the extras of the asset
    events that triggered the run (what the tests read back through XCom)."""
    with DAG(dag_id=dag_id, doc_md=doc, schedule=[asset], start_date=datetime(2026, 1, 1), catchup=False,
             tags=["e2e"]) as dag:

        @task
        def seen(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
            return [dict(event.extra) for events in triggering_asset_events.values() for event in events]

        seen()
    return dag


on_commits_dag = _on_asset("e2e_on_commits", "Runs after job e2e_watched committed new batches to its table.",
                           watched_table)


DEPLOYED_JOB = "e2e_deployed"
deployed_table = sink_asset({"kind": "delta", "uri": str(STACK_HOME / "deployed-table"), "mode": "merge",
                             "keys": ["user"]}, watchers=[
    AssetWatcher(name="e2e_deployed_commits", trigger=SparkpointCommitTrigger(
        job_name=DEPLOYED_JOB, sparkpoint_conn_id="sparkpoint_default", poll_interval=1)),
])
# Named by the storage root (not the connection): the blue-green DAG's savepoint operator
# emits its own event on the connection-named asset; this DAG hears of the watcher's only.
deployed_savepoints = savepoints_asset(DEPLOYED_JOB, checkpoint_dir=str(STACK_HOME / "sparkpoint"), watchers=[
    AssetWatcher(name="e2e_deployed_savepoints", trigger=SparkpointSavepointTrigger(
        job_name=DEPLOYED_JOB, checkpoint_dir=str(STACK_HOME / "sparkpoint"), poll_interval=1)),
])

on_deployed_commits_dag = _on_asset(
    "e2e_on_deployed_commits", "Runs after job e2e_deployed committed new batches to its table.",
    deployed_table)
deploy_on_savepoint_dag = _on_asset(
    "e2e_deploy_on_savepoint",
    "Runs after job e2e_deployed completed a new savepoint; returns what a deploy would restore.",
    deployed_savepoints)
