"""Event deduplication with a watermark (``dropDuplicatesWithinWatermark``), appended to a
Delta table. The job of ``example_sparkpoint_write_audit_publish``.

Input: JSON lines ``{"event_id": "e1", "ts": "2026-01-01T00:00:00Z", "user": "u1",
"amount": 7}``; producers retry, so the same event can arrive more than once, in the
same file or later. Each ``event_id`` is written once as long as its copies arrive
within ``--watermark`` (event time) of each other. Output columns: the input's.

Run by hand::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=events \\
        dags/jobs/dedup_events.py --input /tmp/raw-events --output /tmp/events --watermark "1 hour"
"""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.runtime import SparkpointJob


def build_query(spark: Any, input_path: str, *, watermark: str, files_per_batch: int) -> Any:
    """The streaming query: the first copy of every event id."""
    events = (
        spark.readStream.schema("event_id string, ts timestamp, user string, amount long")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(input_path)
    )
    return events.withWatermark("ts", watermark).dropDuplicatesWithinWatermark(["event_id"])


def main(job: SparkpointJob) -> None:
    """The pipeline (`SparkpointJob.main` builds the job, reports the run and exits)."""
    from airflow_sparkpoint.sinks import DeltaSink

    query = build_query(job.spark, job.arg("input"), watermark=job.arg("watermark", "1 hour"),
                        files_per_batch=int(job.arg("files-per-batch", "1")))
    job.run(query, sink=DeltaSink(job.arg("output"), mode="append"), output_mode="append")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-dedup-events")
