"""Running totals per user merged into a Delta table by a key derived in the query.

    spark-submit merge_key_job.py --input DIR --output TABLE --key lower|exact

``--key lower`` is the bug a user ships: users that differ only in case get one merge
key, so a batch holding both has duplicate keys. ``--key exact`` is the fix. Both keep
the same state (the aggregation by ``user``), so the fixed job restores the checkpoints
of the buggy one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_sparkpoint.runtime import SparkpointJob


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(merge_key, app_name="merge-key")  # prints the result line, then exits


def merge_key(job: SparkpointJob) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink

    events = (
        job.spark.readStream.schema("id long, user string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(job.arg("input"))
    )
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    key = F.lower("user") if job.arg("key") == "lower" else F.col("user")
    keyed = totals.select(key.alias("key"), "total", "events")
    job.run(keyed, sink=DeltaSink(job.arg("output"), mode="merge", keys=["key"]), output_mode="update")


if __name__ == "__main__":
    main()
