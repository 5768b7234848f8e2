"""
### Weekly restore drill of the latest savepoint

A savepoint that was never restored is a hope, not a backup. Every week this DAG takes
the newest savepoint of the alerting job (``jobs/threshold_alerts.py``, e.g. the ones
``example_sparkpoint_scheduled_savepoints`` takes) and restores it for real:
`SparkpointDrillOperator` submits the same application, with the same parameters, from
that savepoint under a scratch identity (its own Sparkpoint directory and job name, its
output table under a scratch directory), lets it catch up on the input that arrived
since (``availableNow``) and checks that it finished from that savepoint. The outcome is
recorded next to the savepoint: ``sparkpoint list --json`` shows ``verified_at`` or
``verify_error``. The production job, its generations and its Delta table are never
touched.

When the savepoint does not restore (a file lost or corrupt, state the new code cannot
read, the application failing), the task fails and its notifier fires. `DrillFailureAlert`
below writes an alert line to ``params.alert_file`` and an ERROR to the task log; add
your deployment's notifier next to it (``SmtpNotifier`` of the SMTP provider, Slack,
PagerDuty).

Storage: the ``sparkpoint_default`` connection (the production job's root; its S3
settings serve the drill too); Spark: the ``spark_default`` connection and the
cluster's ``spark-defaults.conf``. The drill's own directory is taken under
``params.drill_dir`` (Spark's live location inside it) and deleted afterwards.

Params: ``job_name``, ``input`` and ``output`` (the production job's own arguments; the
drill replaces ``--output`` with its scratch table), ``drill_dir`` and ``alert_file``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, BaseNotifier, Param

from airflow_sparkpoint.operators import SparkpointDrillOperator

JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "threshold_alerts.py")
STORAGE = "sparkpoint_default"  # the sparkpoint connection: the production job's storage
DATA = "/opt/sparkpoint/data"


class DrillFailureAlert(BaseNotifier):
    """Fails loudly: one JSON line per failed drill in `alert_file`, and an ERROR in the log."""

    template_fields = ("alert_file",)

    def __init__(self, alert_file: str) -> None:
        super().__init__()
        self.alert_file = alert_file

    def notify(self, context: Any) -> None:
        ti = context["ti"]
        alert = {"at": time.time(), "dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
                 "error": str(context.get("exception") or "unknown")}
        self.log.error("RESTORE DRILL FAILED: %s", alert["error"])
        os.makedirs(os.path.dirname(self.alert_file) or ".", exist_ok=True)
        with open(self.alert_file, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(alert) + "\n")


with DAG(
    dag_id="example_sparkpoint_restore_drill",
    description="Weekly restore drill of the newest savepoint, under a scratch identity",
    doc_md=__doc__,
    schedule=timedelta(days=7),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "savepoint", "drill"],
    params={
        "job_name": Param("sensor_alerts", type="string", description="pipeline name of the production job"),
        "input": Param(f"{DATA}/sensor-alerts/readings", type="string", description="its input (read only)"),
        "output": Param(f"{DATA}/sensor-alerts/alerts", type="string",
                        description="its Delta table (the drill writes a scratch table instead)"),
        "drill_dir": Param(f"{DATA}/drills", type="string", description="scratch root of the drills"),
        "alert_file": Param(f"{DATA}/drills/alerts.jsonl", type="string",
                            description="where failed drills are reported"),
    },
) as dag:
    SparkpointDrillOperator(
        task_id="restore_drill",
        job_name="{{ params.job_name }}",
        sparkpoint_conn_id=STORAGE,
        snapshot="latest_savepoint",
        drill_dir="{{ params.drill_dir }}",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        # The production job's own arguments; the drill replaces its output.
        application_args=["--input", "{{ params.input }}", "--output", "{{ params.output }}",
                          "--limit", "90", "--readings", "3"],
        output_args={"--output": "{scratch}/alerts"},
        work_dir=os.environ.get("SPARKPOINT_WORK_DIR") or None,  # only used with an s3:// drill_dir
        on_failure_callback=[DrillFailureAlert(alert_file="{{ params.alert_file }}")],
    )
