"""
### Scheduled savepoints of a long-running streaming job

Every 30 minutes, ask the running job (e.g. ``jobs/threshold_alerts.py`` started with
``trigger="processingTime:10s"``) for a savepoint: the job takes it between two
micro-batches and keeps running. Savepoints are self-contained, relocatable copies of
state and source positions: restore one with ``SparkpointSubmitOperator(restore=<path>)``
(or ``spark.sparkpoint.restore``) to roll back, to fork the job, or to move it.

History retention, like the Flink Kubernetes operator's: after every savepoint, those
beyond the ``MAX_COUNT`` newest or older than ``MAX_AGE`` are disposed of; the newest
is always kept. Checkpoints are not affected (they have their own ``numRetained``).

A job that is not running is not savepointed (``from_checkpoint_if_not_running=False``):
the run fails, which is the alert that the job is down.

Params: ``job_name`` (the running job's pipeline name); its storage: the
``sparkpoint_default`` connection.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_sparkpoint.hooks import SparkpointHook
from airflow_sparkpoint.operators import SparkpointSavepointOperator

STORAGE = "sparkpoint_default"  # the sparkpoint connection of the running job's storage
MAX_COUNT = 3  # savepoints kept (newest first)
MAX_AGE = timedelta(days=7)  # and none older than this (the newest is always kept)

with DAG(
    dag_id="example_sparkpoint_scheduled_savepoints",
    description="Periodic savepoints of a running job with savepoint history retention",
    doc_md=__doc__,
    schedule=timedelta(minutes=30),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "savepoint", "retention"],
    params={
        "job_name": Param("sensor_alerts", type="string", description="pipeline name of the running job"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
) as dag:
    savepoint = SparkpointSavepointOperator(
        task_id="savepoint",
        job_name="{{ params.job_name }}",
        sparkpoint_conn_id=STORAGE,
        from_checkpoint_if_not_running=False,
        timeout="10 minutes",  # the job answers between micro-batches
        max_count=MAX_COUNT,
        max_age=MAX_AGE,
    )

    @task
    def retained_savepoints(new_savepoint: str, params: Any = None) -> list[str]:
        """The savepoints kept after retention, newest first (the new one is among them)."""
        catalog = SparkpointHook(STORAGE).get_catalog(params["job_name"])
        kept = [entry.uri for entry in catalog.list_savepoints() if entry.valid]  # newest first
        if new_savepoint not in kept:
            raise ValueError(f"the new savepoint {new_savepoint} is not among the retained ones: {kept}")
        return kept

    retained_savepoints(savepoint.output)
