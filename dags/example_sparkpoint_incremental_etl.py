"""
### Incremental ETL: a scheduled streaming job that resumes, never restarts

Every hour, ``jobs/windowed_counts.py`` processes the page views that arrived since the
last run (``trigger="availableNow"``: drain the new input, checkpoint, stop) and merges
views per 10-minute event-time window and page into a Delta table. Window state (and
the watermark) carries over from run to run in the job's checkpoints, so a window that
spans two runs keeps counting in place.

A run that dies (executor lost, OOM, a killed machine) is retried by Airflow; the retry
restores the latest completed checkpoint and continues from there: no input is read
twice into the table, none is skipped, and no batch is committed twice (each Delta
commit carries the job's batch id and a repeat is a no-op).

Storage: the ``sparkpoint_default`` connection (a path, ``file://`` or ``s3://``); Spark:
the ``spark_default`` connection and the cluster's ``spark-defaults.conf``; Spark's live
checkpoint under ``$SPARKPOINT_WORK_DIR`` when set.

Params: ``input`` (JSON lines ``{"page", "ts", "user"}``), ``output`` (the Delta table),
``window`` and ``watermark`` (Spark interval strings), ``restore`` (restore a chosen
savepoint or checkpoint by hand: trigger a run with its path, as ``sparkpoint list``
shows it; every try of that run restores it. A sink that already committed past it is
refused unless ``restore.sinkAhead=rewind``; empty, the default: resume).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_sparkpoint.operators import SparkpointSubmitOperator

JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "windowed_counts.py")
DATA = "/opt/sparkpoint/data/incremental-etl"

with DAG(
    dag_id="example_sparkpoint_incremental_etl",
    description="Hourly availableNow run of a windowed aggregation into Delta; retries resume",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one run at a time owns the job's state
    tags=["sparkpoint", "example", "incremental", "delta"],
    params={
        "input": Param(f"{DATA}/input", type="string", description="page views (JSON lines)"),
        "output": Param(f"{DATA}/views_per_window", type="string",
                        description="Delta table, merged by window and page"),
        "window": Param("10 minutes", type="string", description="tumbling window length"),
        "watermark": Param("30 minutes", type="string", description="how late an event may arrive"),
        "restore": Param("", type="string",
                         description="restore this savepoint or checkpoint (a path from "
                                     "`sparkpoint list`) on every "
                                     "try of this run; empty: resume from the job's latest checkpoint"),
    },
    default_args={"retries": 3, "retry_delay": timedelta(minutes=1)},
) as dag:
    SparkpointSubmitOperator(
        task_id="windowed_counts",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=[
            "--input", "{{ params.input }}",
            "--output", "{{ params.output }}",
            "--window", "{{ params.window }}",
            "--watermark", "{{ params.watermark }}",
        ],
        job_name="etl_windowed_counts",
        sparkpoint_conn_id="sparkpoint_default",
        work_dir=os.environ.get("SPARKPOINT_WORK_DIR") or None,
        restore_snapshot="{{ params.restore }}",  # a hand-chosen restore; empty: not set
        trigger="availableNow",
        checkpoint_interval="0",  # a retained checkpoint after every micro-batch: a retry loses nothing
        num_retained=3,
    )
