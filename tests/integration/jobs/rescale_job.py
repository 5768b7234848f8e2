"""Per-user running totals into a Delta table (merge on ``user``) by one of three
stateful pipelines, for the rescale-on-restore tests:

``aggregation``  groupBy(user).agg(sum, count)                 (Spark's stateStoreSave)
``tws``          transformWithStateInPandas, one ValueState per user (total, events)
``limit``        a streaming ``limit`` (Spark's globalLimit: not repartitionable), appended

Arguments: ``--pipeline NAME --input DIR --output TABLE``. Prints the run result as
``SPARKPOINT_RESULT {json}``.
"""

from __future__ import annotations

from typing import Any


def build(spark: Any, pipeline: str, inputs: str) -> tuple[Any, dict[str, Any], str]:
    """(the streaming DataFrame, the DeltaSink arguments, the output mode) of `pipeline`."""
    from pyspark.sql import functions as F

    events = spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(inputs)
    if pipeline == "aggregation":
        totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
        return totals, {"mode": "merge", "keys": ["user"]}, "update"
    if pipeline == "tws":
        return events.groupBy("user").transformWithStateInPandas(
            statefulProcessor=_running_totals(), outputStructType="user string, total long, events long",
            outputMode="Update", timeMode="None",
        ), {"mode": "merge", "keys": ["user"]}, "update"
    if pipeline == "limit":
        return events.limit(1000), {"mode": "append"}, "append"
    raise SystemExit(f"--pipeline {pipeline!r}: expected aggregation, tws or limit")


def _running_totals() -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class RunningTotals(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("totals", "total long, events long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            total, count = self.state.get() if self.state.exists() else (0, 0)
            for frame in rows:
                total += int(frame["amount"].sum())
                count += len(frame)
            self.state.update((total, count))
            yield pd.DataFrame({"user": [key[0]], "total": [total], "events": [count]})

        def close(self) -> None:
            pass

    return RunningTotals()


def main() -> None:
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(rescale, app_name="sparkpoint-rescale-test")  # prints the result line, then exits


def rescale(job: Any) -> None:
    from airflow_sparkpoint.sinks import DeltaSink

    df, sink_args, mode = build(job.spark, job.arg("pipeline"), job.arg("input"))
    job.run(df, sink=DeltaSink(job.arg("output"), **sink_args), output_mode=mode)


if __name__ == "__main__":
    main()
