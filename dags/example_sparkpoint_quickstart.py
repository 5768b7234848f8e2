"""Quickstart: per-user running totals from JSON files into a Delta table, with retries
that resume from the latest retained checkpoint instead of starting over.

Trigger with a run conf to point it elsewhere::

    {"base_dir": "/tmp/sparkpoint-quickstart"}

(``input``/``output``/``checkpoints`` live under it), or ``{"restore": "<path>"}`` to
restore a savepoint or checkpoint chosen by hand (``sparkpoint list`` shows them) on
every try of that run. Spark runs where the ``spark_default``
connection points (``local[2]`` in `make demo`). `make demo` runs this DAG.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_sparkpoint.operators import SparkpointSubmitOperator

JOBS = Path(__file__).parent / "jobs"
BASE = os.environ.get("SPARKPOINT_QUICKSTART_DIR", "/tmp/sparkpoint-quickstart")

with DAG(
    dag_id="example_sparkpoint_quickstart",
    description="Checkpointed PySpark totals into Delta; a retry resumes, it never starts over",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["sparkpoint", "example"],
    params={
        "base_dir": Param(BASE, type="string", description="folder with input/, output/, checkpoints/"),
        "restore": Param("", type="string",
                         description="restore this savepoint or checkpoint (a path from "
                                     "`sparkpoint list`) on every "
                                      "try of this run; empty: resume from the job's latest checkpoint"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
) as dag:
    SparkpointSubmitOperator(
        task_id="running_totals",
        application=str(JOBS / "quickstart_totals.py"),
        job_name="quickstart",
        checkpoint_dir="{{ params.base_dir }}/checkpoints",
        restore_snapshot="{{ params.restore }}",  # a hand-chosen restore; empty: resume
        application_args=["--input", "{{ params.base_dir }}/input", "--output",
                          "{{ params.base_dir }}/output"],
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.log.level": "WARN",
        },
    )
