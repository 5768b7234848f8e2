"""Chaos job: de-duplicated events as JSON files under an S3 prefix (S3Sink: pending
multipart uploads are the pre-commit).

    spark-submit --conf spark.sparkpoint.s3.endpoint=http://... s3_job.py --input DIR --output s3://bucket/prefix
"""

from __future__ import annotations

import json
import logging


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import S3Sink

    job = SparkpointJob.get_or_create(app_name="chaos-s3")
    events = (
        job.spark.readStream.schema("id long, user string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(job.arg("input"))
    )
    result = job.run(events.dropDuplicates(["id"]), sink=S3Sink(job.arg("output"), format="json"),
                     output_mode="append")
    print("SPARKPOINT_RESULT " + json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main()
