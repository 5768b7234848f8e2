"""Per-user totals (a streaming aggregation, output mode update) from a JSON file
source, one file per batch, appended to a Delta table (``--sink delta``) or written by
a `DirectorySink` as Parquet (``--sink dir``): blue of the shadow follow tests. The same
query is green's (`tests.integration.test_shadow_follow.totals`)."""

from __future__ import annotations

from airflow_sparkpoint.runtime import SparkpointJob


def totals(job: SparkpointJob):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    events = job.spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
        job.arg("input"))
    return events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))


def sink_of(job: SparkpointJob):  # type: ignore[no-untyped-def]
    from airflow_sparkpoint.sinks import DeltaSink, DirectorySink

    kind = job.arg("sink", "delta")
    if kind == "delta":
        return DeltaSink(job.arg("output"), mode="append")
    if kind == "dir":
        return DirectorySink(job.arg("output"), format="parquet")
    raise SystemExit(f"--sink {kind} is not supported; expected delta or dir")


def main(job: SparkpointJob) -> None:
    job.run(totals(job), sink=sink_of(job), output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-shadow-totals")
