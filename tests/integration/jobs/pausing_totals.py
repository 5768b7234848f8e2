"""Per-user totals into Delta (as ``dags/jobs/quickstart_totals.py``), with a test pause
point right after the sink staged a batch: ``sigterm-staged`` (arm it with
``spark.sparkpoint.test.pauseAt=sigterm-staged:<batch>``), so a test can signal the
driver while a batch's output is staged but not yet recorded.
"""

from __future__ import annotations

from typing import Any


def main() -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint import faults
    from airflow_sparkpoint.checkpoints.run_result import result_line
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    class PausingDeltaSink(DeltaSink):
        def stage(self, df: Any, ctx: Any) -> dict[str, Any]:
            payload = super().stage(df, ctx)
            faults.pause("sigterm-staged", ctx.batch_id)
            return payload

    job = SparkpointJob.get_or_create(app_name="sparkpoint-pausing-totals")
    events = job.spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
        job.arg("input"))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    sink = PausingDeltaSink(job.arg("output"), mode="merge", keys=["user"])
    result = job.run(totals, sink=sink, output_mode="update")
    print(result_line(result), flush=True)


if __name__ == "__main__":
    from airflow_sparkpoint.process_exit import exit_process

    main()
    exit_process(0)  # finished and reported: no native library's teardown can fail the run now
