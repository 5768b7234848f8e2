"""Windowed counts in event time: page views per page in tumbling windows, with a
watermark, merged into a Delta table by (window, page). The job of
``example_sparkpoint_incremental_etl``.

Input: JSON lines ``{"page": "/home", "ts": "2026-01-01T00:03:00Z", "user": "u1"}``.
Output columns: ``window_start``, ``window_end``, ``page``, ``views``.

``update`` output mode: every micro-batch re-emits the windows it changed and the merge
sink upserts them, so a window that spans two scheduled runs keeps growing in place.
Events later than ``--watermark`` behind the newest event time are dropped (their
window's state is gone).

Run by hand::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=views \\
        dags/jobs/windowed_counts.py --input /tmp/views --output /tmp/views_per_window \\
        --window "10 minutes" --watermark "30 minutes"
"""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.runtime import SparkpointJob


def build_query(spark: Any, input_path: str, *, window: str, watermark: str, files_per_batch: int) -> Any:
    """The streaming query: views per (tumbling window, page)."""
    from pyspark.sql import functions as F

    views = (
        spark.readStream.schema("page string, ts timestamp, user string")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(input_path)
    )
    counts = (
        views.withWatermark("ts", watermark)
        .groupBy(F.window("ts", window).alias("window"), "page")
        .agg(F.count("*").alias("views"))
    )
    return counts.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "page",
        "views",
    )


def main(job: SparkpointJob) -> None:
    """The pipeline (`SparkpointJob.main` builds the job, reports the run and exits)."""
    from airflow_sparkpoint.sinks import DeltaSink

    query = build_query(job.spark, job.arg("input"), window=job.arg("window", "10 minutes"),
                        watermark=job.arg("watermark", "30 minutes"),
                        files_per_batch=int(job.arg("files-per-batch", "1")))
    sink = DeltaSink(job.arg("output"), mode="merge", keys=["window_start", "page"])
    job.run(query, sink=sink, output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-windowed-counts")
