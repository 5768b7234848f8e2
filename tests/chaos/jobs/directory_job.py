"""Chaos job: de-duplicated events as JSON files in a local directory (DirectorySink:
Spark's writer into hidden ``_staging``, promoted by rename).

    spark-submit ... directory_job.py --input DIR --output DIR
"""

from __future__ import annotations

import json
import logging


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DirectorySink

    job = SparkpointJob.get_or_create(app_name="chaos-directory")
    events = (
        job.spark.readStream.schema("id long, user string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(job.arg("input"))
    )
    result = job.run(events.dropDuplicates(["id"]), sink=DirectorySink(job.arg("output"), format="json"),
                     output_mode="append")
    print("SPARKPOINT_RESULT " + json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main()
