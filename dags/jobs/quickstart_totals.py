"""Quickstart PySpark job: per-user running totals of JSON events into a Delta table.

Submitted by ``example_sparkpoint_quickstart`` through `SparkpointSubmitOperator`;
runnable by hand as well::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=quickstart \\
        dags/jobs/quickstart_totals.py --input /tmp/events --output /tmp/totals
"""

from __future__ import annotations

from airflow_sparkpoint.runtime import SparkpointJob


def main(job: SparkpointJob) -> None:
    """The pipeline (`SparkpointJob.main` builds the job, reports the run and exits)."""
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink

    spark = job.spark
    events = (
        spark.readStream.schema("user string, amount long")
        # One file per micro-batch keeps the batches deterministic (and the demo visible).
        .option("maxFilesPerTrigger", int(job.arg("files-per-batch", "1")))
        .json(job.arg("input"))
    )
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    job.run(totals, sink=DeltaSink(job.arg("output"), mode="merge", keys=["user"]), output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-quickstart")
