"""
### Data-aware scheduling on a streaming job: committed data and savepoints as assets

The alerting job (``jobs/threshold_alerts.py``, started by
``example_sparkpoint_scheduled_savepoints``' sibling deployments with
``trigger="processingTime:10s"``) runs for days in one task, so task-completion events
say nothing about when its data lands. Two DAGs here are scheduled on what it makes
durable, through Airflow's event-driven scheduling (an `AssetWatcher` whose trigger runs
in the triggerer):

* ``example_sparkpoint_on_committed_alerts`` runs after the job committed new batches to
  its Delta table (`SparkpointCommitTrigger`: one look at the job's commit head per poll).
  Staged batches and batches that were aborted (a killed driver, a rolled-back green)
  never trigger it: the commit head moves only after the table shows the batch.
* ``example_sparkpoint_on_savepoint`` runs after each new completed savepoint of the job
  (`SparkpointSavepointTrigger`) and restores it under a scratch identity
  (`SparkpointVerifyOperator`): a deploy pipeline that only goes on from a savepoint
  that was proven to restore.

The assets are named by `airflow_sparkpoint.assets`: the table's URI, and
``sparkpoint://<connection>/<job>/savepoints``. Each event's ``extra["payload"]`` names
the job, the generation, the batches (``after_batch`` .. ``last_batch``), the commit's
``seq`` and the Delta table version, or the savepoint URI: a consumer that must not act
twice on one commit dedupes on ``seq`` (a triggerer restart may repeat the last event).
``example_sparkpoint_scheduled_savepoints`` savepoints this job with
`SparkpointSavepointOperator`, which emits its own event on the same asset: the tasks
read every event through `event_details` (either kind), and one savepoint may start the
drill twice (a second drill of a proven savepoint is redundant, not harmful).

Storage: the ``sparkpoint_default`` connection.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, AssetWatcher, task

from airflow_sparkpoint.assets import event_details, savepoints_asset, sink_asset
from airflow_sparkpoint.operators import SparkpointVerifyOperator
from airflow_sparkpoint.triggers import SparkpointCommitTrigger, SparkpointSavepointTrigger

JOB = "sensor_alerts"  # the streaming job's pipeline name
JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "threshold_alerts.py")
STORAGE = "sparkpoint_default"  # the sparkpoint connection of its storage
DATA = "/opt/sparkpoint/data"
#: the job's sink, as its script declares it (``DeltaSink(--output, mode="append")``)
ALERTS_SINK = {"kind": "delta", "uri": f"{DATA}/sensor-alerts/alerts", "mode": "append"}

alerts_table = sink_asset(ALERTS_SINK, watchers=[
    AssetWatcher(name="sensor_alerts_commits",
                 trigger=SparkpointCommitTrigger(job_name=JOB, sparkpoint_conn_id=STORAGE, poll_interval=10)),
])
alerts_savepoints = savepoints_asset(JOB, sparkpoint_conn_id=STORAGE, watchers=[
    AssetWatcher(name="sensor_alerts_savepoints",
                 trigger=SparkpointSavepointTrigger(job_name=JOB, sparkpoint_conn_id=STORAGE,
                                                    poll_interval=30)),
])


def payloads(events: Any) -> list[dict[str, Any]]:
    """What the events of an asset-triggered run say, oldest first: the watcher's, and
    those of an operator on the same asset (``example_sparkpoint_scheduled_savepoints``
    savepoints this job with `SparkpointSavepointOperator`, which emits its own event)."""
    return [event_details(event.extra) for batch in events.values() for event in batch]


with DAG(
    dag_id="example_sparkpoint_on_committed_alerts",
    description="Runs after the streaming job committed new alerts to its Delta table",
    doc_md=__doc__,
    schedule=[alerts_table],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["sparkpoint", "example", "assets"],
) as on_committed:

    @task
    def new_alerts(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """What was committed since the previous run (one event per commit seen)."""
        seen = payloads(triggering_asset_events)
        for payload in seen:
            print(f"job {payload['job']} generation {payload['generation']} committed batches "
                  f"{payload.get('after_batch')}..{payload['last_batch']} (Delta version "
                  f"{payload['sink_version']})")
        return seen

    new_alerts()

with DAG(
    dag_id="example_sparkpoint_on_savepoint",
    description="Restores each new savepoint of the streaming job under a scratch identity",
    doc_md=__doc__,
    schedule=[alerts_savepoints],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "assets", "savepoint"],
) as on_savepoint:

    @task
    def newest_savepoint(triggering_asset_events: Any = None) -> str:
        """The newest savepoint among the events of this run."""
        return str(payloads(triggering_asset_events)[-1]["savepoint"])

    SparkpointVerifyOperator(
        task_id="restore_drill",
        application=JOB_SCRIPT,
        conn_id="spark_default",
        job_name=JOB,
        sparkpoint_conn_id=STORAGE,
        snapshot=newest_savepoint(),
        application_args=["--input", f"{DATA}/sensor-alerts/readings", "--output",
                          f"{DATA}/sensor-alerts/alerts", "--limit", "90", "--readings", "3"],
        output_args={"--output": "{scratch}/alerts"},
        drill_dir=f"{DATA}/drills",
    )
