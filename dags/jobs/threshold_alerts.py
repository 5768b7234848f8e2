"""Threshold alerts with `ListState`: an alert after N consecutive readings over a limit
(the Flink "alert after N readings over a limit" example), appended to a Delta table.
The long-running job of ``example_sparkpoint_scheduled_savepoints``.

Input: JSON lines ``{"sensor": "s1", "ts": "2026-01-01T00:00:00Z", "value": 97.5}``.
Per sensor, readings over ``--limit`` are buffered in a `ListState` (``over_limit``); a
reading at or under the limit clears the buffer; when the buffer holds ``--readings``
readings, one alert row is emitted (``sensor``, ``first_ts``, ``last_ts``, ``readings``,
``peak``), the buffer starts over and the sensor's `ValueState` ``alerts`` (alerts
raised so far) goes up by one. Readings of a sensor are taken in event-time order
within a micro-batch.

State retention: without ``--state-ttl`` every sensor that ever alerted keeps its
``alerts`` row forever, so the state grows with the number of sensors ever seen. With
``--state-ttl 7d`` (``ms``, ``s``, ``min``, ``h`` or ``d``) both state variables use
transformWithState's TTL (processing time): a sensor's state expires that long after
its last update and Spark removes it at the end of a later micro-batch. A buffered
streak of a sensor that went quiet for longer than the TTL starts over. ``sparkpoint
inspect`` shows the row counts of ``over_limit`` and ``alerts`` (see docs/howto/state-ttl.md).

Run by hand (a long-running job; stop it with ``sparkpoint savepoint --stop``)::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=alerts \\
        --conf spark.sparkpoint.trigger=processingTime:10s \\
        dags/jobs/threshold_alerts.py --input /tmp/readings --output /tmp/alerts --limit 90 --readings 3
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from airflow_sparkpoint.runtime import SparkpointJob

OUTPUT_SCHEMA = "sensor string, first_ts timestamp, last_ts timestamp, readings int, peak double"
_TTL_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_ttl_ms(text: str) -> int | None:
    """``--state-ttl``: ``none``/``0`` (no TTL) or a positive duration like ``500ms``,
    ``30s``, ``10min``, ``12h``, ``7d``; returns milliseconds or None."""
    value = text.strip().lower()
    if value in ("", "0", "none"):
        return None
    match = re.fullmatch(r"(\d+)\s*(ms|s|min|h|d)", value)
    if not match or int(match.group(1)) <= 0:
        raise SystemExit(f"--state-ttl {text!r} is invalid; expected none or a duration like 30s, 12h or 7d")
    return int(match.group(1)) * _TTL_UNITS_MS[match.group(2)]


def build_query(
    spark: Any, input_path: str, *, limit: float, readings: int, files_per_batch: int,
    state_ttl_ms: int | None = None
) -> Any:
    """The streaming query: per sensor, a `ListState` of readings over the limit and a
    `ValueState` counting its alerts; with `state_ttl_ms`, both expire that long after
    their last update (transformWithState TTL needs processing-time mode)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class ThresholdAlerts(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.over = handle.getListState("over_limit", "ts timestamp, value double", state_ttl_ms)
            self.alerts = handle.getValueState("alerts", "count long", state_ttl_ms)

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
                raised = self.alerts.get()[0] if self.alerts.exists() else 0
                self.alerts.update((raised + len(alerts),))
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
        timeMode="ProcessingTime" if state_ttl_ms else "None",
    )


def main(job: SparkpointJob) -> None:
    """The pipeline (`SparkpointJob.main` builds the job, reports the run and exits)."""
    from airflow_sparkpoint.sinks import DeltaSink

    readings = int(job.arg("readings", "3"))
    if readings < 1:
        raise SystemExit(f"--readings {readings} is invalid; expected an integer >= 1")
    state_ttl_ms = parse_ttl_ms(job.arg("state-ttl", "none"))
    if state_ttl_ms and job.config.trigger.kind == "availableNow":
        # A processing-time transformWithState asks for a no-data batch after every batch
        # (Spark 4.2): availableNow would never finish. TTL is still enforced in data batches.
        job.spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    query = build_query(job.spark, job.arg("input"), limit=float(job.arg("limit", "90")), readings=readings,
                        files_per_batch=int(job.arg("files-per-batch", "1")), state_ttl_ms=state_ttl_ms)
    job.run(query, sink=DeltaSink(job.arg("output"), mode="append"), output_mode="append")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-threshold-alerts")
