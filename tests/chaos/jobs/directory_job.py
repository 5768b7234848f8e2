"""Chaos job: de-duplicated events as JSON files (DirectorySink: Spark's writer into a
hidden ``_staging``, promoted by rename locally or server-side copy on S3), 3 per batch.

    spark-submit ... directory_job.py --input DIR --output DIR|s3://bucket/prefix
"""

from __future__ import annotations

from typing import Any

from _chaosjob import main, three_files


def build(job: Any, events: Any) -> tuple[Any, Any, str]:
    from airflow_sparkpoint.sinks import DirectorySink

    return (three_files(events.dropDuplicates(["id"])), DirectorySink(job.arg("output"), format="json"),
            "append")


if __name__ == "__main__":
    main("chaos-directory", build)
