"""Chaos job: per-user running totals merged into a Delta table (DeltaSink mode=merge).

    spark-submit ... delta_merge_job.py --input DIR --output TABLE
"""

from __future__ import annotations

from typing import Any

from _chaosjob import main, three_files


def build(job: Any, events: Any) -> tuple[Any, Any, str]:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink

    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    return three_files(totals), DeltaSink(job.arg("output"), mode="merge", keys=["user"]), "update"


if __name__ == "__main__":
    main("chaos-delta-merge", build)
