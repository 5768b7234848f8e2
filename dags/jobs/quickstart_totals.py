"""Quickstart PySpark job: per-user running totals of JSON events into a Delta table.

Submitted by ``example_sparkpoint_quickstart`` through `SparkpointSubmitOperator`;
runnable by hand as well::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=quickstart \\
        dags/jobs/quickstart_totals.py --input /tmp/events --output /tmp/totals
"""

from __future__ import annotations


def main() -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.checkpoints.run_result import result_line
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(app_name="sparkpoint-quickstart")
    spark = job.spark
    events = (
        spark.readStream.schema("user string, amount long")
        # One file per micro-batch keeps the batches deterministic (and the demo visible).
        .option("maxFilesPerTrigger", int(job.arg("files-per-batch", "1")))
        .json(job.arg("input"))
    )
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = job.run(totals, sink=DeltaSink(job.arg("output"), mode="merge", keys=["user"]), output_mode="update")
    print(result_line(result), flush=True)


if __name__ == "__main__":
    from airflow_sparkpoint.process_exit import exit_process

    main()
    exit_process(0)  # finished and reported: no native library's teardown can fail the run now
