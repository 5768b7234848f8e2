"""Chaos job: de-duplicated events appended to a Delta table (DeltaSink mode=append).

``dropDuplicates`` keeps state, so a restart must restore it; every input id must land
exactly once.

    spark-submit ... delta_append_job.py --input DIR --output TABLE
"""

from __future__ import annotations

import json
import logging


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(app_name="chaos-delta-append")
    events = (
        job.spark.readStream.schema("id long, user string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(job.arg("input"))
    )
    result = job.run(events.dropDuplicates(["id"]), sink=DeltaSink(job.arg("output"), mode="append"),
                     output_mode="append")
    print("SPARKPOINT_RESULT " + json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main()
