"""Per-user totals (a streaming aggregation) merged into Delta, in the state variants a
blue-green deploy meets (``--state``):

- ``v1`` (blue) and ``v2`` (a compatible green: same aggregation, other output code):
  ``sum(amount) as total, count(*) as events``;
- ``added_aggregate``: also ``max(amount)``: the aggregation's state has a column more,
  so Spark refuses to restore v1's state with it.

Output columns: ``user``, ``total``, ``events``, ``code_version`` (and ``top`` for
``added_aggregate``).
"""

from __future__ import annotations

from airflow_sparkpoint.runtime import SparkpointJob


def main(job: SparkpointJob) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink

    variant = job.arg("state", "v1")
    aggregates = [F.sum("amount").alias("total"), F.count("*").alias("events")]
    if variant == "added_aggregate":
        aggregates.append(F.max("amount").alias("top"))
    elif variant not in ("v1", "v2"):
        raise SystemExit(f"--state {variant} is not supported; expected v1, v2 or added_aggregate")
    events = job.spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
        job.arg("input"))
    code_version = 1 if variant == "v1" else 2
    totals = events.groupBy("user").agg(*aggregates).withColumn("code_version", F.lit(code_version))
    job.run(totals, sink=DeltaSink(job.arg("output"), mode="merge", keys=["user"]), output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-preflight-totals")
