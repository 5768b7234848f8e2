"""Threshold alerts with `ListState`: an alert after N consecutive readings over a limit
(the Flink "alert after N readings over a limit" example), appended to a Delta table.
The long-running job of ``example_sparkpoint_scheduled_savepoints``.

Input: JSON lines ``{"sensor": "s1", "ts": "2026-01-01T00:00:00Z", "value": 97.5}``.
Per sensor, readings over ``--limit`` are buffered in a `ListState`; a reading at or
under the limit clears the buffer; when the buffer holds ``--readings`` readings, one
alert row is emitted (``sensor``, ``first_ts``, ``last_ts``, ``readings``, ``peak``) and
the buffer starts over. Readings of a sensor are taken in event-time order within a
micro-batch.

Run by hand (a long-running job; stop it with ``sparkpoint savepoint --stop``)::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=alerts \\
        --conf spark.sparkpoint.trigger=processingTime:10s \\
        dags/jobs/threshold_alerts.py --input /tmp/readings --output /tmp/alerts --limit 90 --readings 3
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

OUTPUT_SCHEMA = "sensor string, first_ts timestamp, last_ts timestamp, readings int, peak double"


def build_query(spark: Any, input_path: str, *, limit: float, readings: int, files_per_batch: int) -> Any:
    """The streaming query: one `ListState` of readings over the limit per sensor."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class ThresholdAlerts(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.over = handle.getListState("over_limit", "ts timestamp, value double")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            buffer = list(self.over.get()) if self.over.exists() else []
            batch = pd.concat(list(rows)).sort_values("ts", kind="stable")
            alerts = []
            for ts, value in zip(batch["ts"], batch["value"]):
                if value <= limit:
                    buffer = []
                    continue
                buffer.append((ts, float(value)))
                if len(buffer) == readings:
                    alerts.append({"sensor": key[0], "first_ts": buffer[0][0], "last_ts": buffer[-1][0],
                                   "readings": readings, "peak": max(v for _, v in buffer)})
                    buffer = []
            if buffer:
                self.over.put(buffer)
            else:
                self.over.clear()
            if alerts:
                yield pd.DataFrame(alerts)

        def close(self) -> None:
            pass

    events = (
        spark.readStream.schema("sensor string, ts timestamp, value double")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(input_path)
    )
    return events.groupBy("sensor").transformWithStateInPandas(
        statefulProcessor=ThresholdAlerts(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="None",
    )


def main() -> None:
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(app_name="sparkpoint-threshold-alerts")
    readings = int(job.arg("readings", "3"))
    if readings < 1:
        raise SystemExit(f"--readings {readings} is invalid; expected an integer >= 1")
    query = build_query(job.spark, job.arg("input"), limit=float(job.arg("limit", "90")), readings=readings,
                        files_per_batch=int(job.arg("files-per-batch", "1")))
    result = job.run(query, sink=DeltaSink(job.arg("output"), mode="append"), output_mode="append")
    print("SPARKPOINT_RESULT " + json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main()
