"""
### Checkpoint health alert for a long-running streaming job

Every 5 minutes, one task checks the job's checkpoints the way Flink users alert on them:
the latest completed checkpoint must be younger than 10 minutes, at most 2 of the last
10 checkpoint attempts may have failed, and the job must be running with a heartbeat
younger than 2 minutes. An unhealthy job fails the task, so Airflow's failure callbacks
and notifiers fire (here a callback that logs the problems; put your Slack / email /
PagerDuty notifier in ``on_failure_callback``). The same run emits the checkpoint metrics
(``sparkpoint.numberOfCompletedCheckpoints``, ``sparkpoint.lastCheckpointDuration``, ...)
through Airflow's metrics (StatsD / OpenTelemetry, as configured).

Params: ``job_name`` (the running job's pipeline name). Storage: the
``sparkpoint_default`` connection (storage root, S3 endpoint and credentials), as the
job's own submit task uses it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param

from airflow_sparkpoint.operators import SparkpointHealthCheckOperator

STORAGE = "sparkpoint_default"  # the sparkpoint connection: storage root, S3 endpoint, credentials


def alert(context: Any) -> None:
    """Where an alert goes; replace with a notifier (e.g. a SlackNotifier instance)."""
    logging.getLogger("sparkpoint.alerts").error(
        "Sparkpoint checkpoint alert for %s: %s", context["params"]["job_name"], context.get("exception"))


with DAG(
    dag_id="example_sparkpoint_health",
    description="Fail (and alert) when a Sparkpoint job's checkpoints are unhealthy",
    doc_md=__doc__,
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "alerting"],
    params={
        "job_name": Param("sensor_alerts", type="string", description="pipeline name of the running job"),
    },
) as dag:
    SparkpointHealthCheckOperator(
        task_id="checkpoint_health",
        job_name="{{ params.job_name }}",
        sparkpoint_conn_id=STORAGE,
        max_checkpoint_age=timedelta(minutes=10),
        max_failure_ratio=0.2,
        failure_window=10,
        max_heartbeat_age=timedelta(minutes=2),
        on_failure_callback=alert,
    )
