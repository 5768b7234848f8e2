"""The guided demo behind ``make demo`` / ``sparkpoint demo``.

Airflow (``dag.test``, SQLite metadata database), local Spark through real
``spark-submit`` and local storage, all under ``--workdir``: an incremental ETL whose
killed first try is resumed by Airflow's retry, a blue-green deploy whose failing green is
rolled back, and one whose healthy green is promoted; then the record and an exactly-once
verdict computed from the Delta tables.

::

    stages.py    the three stages, the record and the verdict (`main`)
    console.py   the terminal, the progress watcher, the verdict lines
    record.py    the record's tables, laid out from the history model
    support.py   a job as its own spark-submit, input files, Delta table readers
                 (shared with the example-DAG tests)

Never imported by the Spark-side runtime.
"""

from __future__ import annotations

from airflow_sparkpoint.demo.command import main
from airflow_sparkpoint.demo.stages import (
    BLUE_AGAIN_INPUT,
    BLUE_BACKLOG,
    FAILING_GREEN_INPUT,
    HEALTHY_GREEN_INPUT,
    Demo,
    batch_of,
    expected_totals,
)

__all__ = [
    "BLUE_AGAIN_INPUT", "BLUE_BACKLOG", "FAILING_GREEN_INPUT", "HEALTHY_GREEN_INPUT", "Demo", "batch_of",
    "expected_totals", "main",
]
