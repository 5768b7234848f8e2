"""Chaos job: de-duplicated events as JSON files under an S3 prefix (S3Sink: pending
multipart uploads are the pre-commit), 3 per batch.

    spark-submit --conf spark.sparkpoint.s3.endpoint=http://... s3_job.py --input DIR --output s3://bucket/prefix
"""

from __future__ import annotations

from typing import Any

from _chaosjob import main, three_files


def build(job: Any, events: Any) -> tuple[Any, Any, str]:
    from airflow_sparkpoint.sinks import S3Sink

    return three_files(events.dropDuplicates(["id"])), S3Sink(job.arg("output"), format="json"), "append"


if __name__ == "__main__":
    main("chaos-s3", build)
