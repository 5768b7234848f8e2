"""Chaos job: de-duplicated events appended to a Delta table (DeltaSink mode=append),
partitioned by user (3 files per batch).

``dropDuplicates`` keeps state, so a restart must restore it; every input id must land
exactly once.

    spark-submit ... delta_append_job.py --input DIR --output TABLE
"""

from __future__ import annotations

from typing import Any

from _chaosjob import main


def build(job: Any, events: Any) -> tuple[Any, Any, str]:
    from airflow_sparkpoint.sinks import DeltaSink

    return (events.dropDuplicates(["id"]), DeltaSink(job.arg("output"), mode="append", partition_by=["user"]),
            "append")


if __name__ == "__main__":
    main("chaos-delta-append", build)
