"""Chaos job: per-user running totals merged into a Delta table (DeltaSink mode=merge).

    spark-submit ... delta_merge_job.py --input DIR --output TABLE
"""

from __future__ import annotations

import json
import logging


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(app_name="chaos-delta-merge")
    events = (
        job.spark.readStream.schema("id long, user string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(job.arg("input"))
    )
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = job.run(totals, sink=DeltaSink(job.arg("output"), mode="merge", keys=["user"]), output_mode="update")
    print("SPARKPOINT_RESULT " + json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main()
