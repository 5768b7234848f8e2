"""Per-user totals into Delta (as ``dags/jobs/quickstart_totals.py``), with a test pause
point right after the sink staged a batch: ``sigterm-staged`` (arm it with
``spark.sparkpoint.test.pauseAt=sigterm-staged:<batch>``), so a test can signal the
driver while a batch's output is staged but not yet recorded.
"""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.runtime import SparkpointJob


def main(job: SparkpointJob) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint import faults
    from airflow_sparkpoint.sinks import DeltaSink

    class PausingDeltaSink(DeltaSink):
        def stage(self, df: Any, ctx: Any) -> dict[str, Any]:
            payload = super().stage(df, ctx)
            faults.pause("sigterm-staged", ctx.batch_id)
            return payload

    events = job.spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
        job.arg("input"))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    sink = PausingDeltaSink(job.arg("output"), mode="merge", keys=["user"])
    job.run(totals, sink=sink, output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-pausing-totals")
