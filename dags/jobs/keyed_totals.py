"""Keyed running totals with `ValueState` (``transformWithStateInPandas``) merged into a
Delta table by key. The job deployed blue-green by ``example_sparkpoint_blue_green``.

Input: JSON lines ``{"user": "u1", "amount": 7}``. Output table columns: ``user``,
``total``, ``events``, ``code_version``.

- ``--version 1`` (blue) and ``--version 2`` (green, the new code) keep the same state
  (one ``ValueState`` per user, same name and schema) and the same table schema, so green
  restores blue's savepoint and blue restores it back. Version 2 writes
  ``code_version = 2``, which shows in the table which code produced each row.
- ``--fail-after-batch N`` (version 2 only) raises on any micro-batch after batch N:
  it simulates an unhealthy green for the rollback branch of the blue-green DAG.
- ``--files-per-batch N`` files per micro-batch (default 1).

Run by hand::

    spark-submit --conf spark.sparkpoint.dir=/tmp/sp --conf spark.sparkpoint.job=totals \\
        dags/jobs/keyed_totals.py --input /tmp/events --output /tmp/totals --version 1
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from airflow_sparkpoint.runtime import SparkpointJob

OUTPUT_SCHEMA = "user string, total long, events long, code_version int"


def build_query(spark: Any, input_path: str, *, version: int, files_per_batch: int) -> Any:
    """The streaming query: per-user totals kept in a `ValueState`."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class RunningTotals(StatefulProcessor):
        """One `ValueState` per user: (total, events). Emits the new totals of every user
        seen in the batch."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            # The state's name and schema are the contract between versions.
            self.totals = handle.getValueState("totals", "total long, events long")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            total, events = self.totals.get() if self.totals.exists() else (0, 0)
            for frame in rows:
                total += int(frame["amount"].sum())
                events += len(frame)
            self.totals.update((total, events))
            yield pd.DataFrame(
                {"user": [key[0]], "total": [total], "events": [events], "code_version": [version]}
            )

        def close(self) -> None:
            pass

    events = (
        spark.readStream.schema("user string, amount long")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(input_path)
    )
    return events.groupBy("user").transformWithStateInPandas(
        statefulProcessor=RunningTotals(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Update",
        timeMode="None",
    )


def main(job: SparkpointJob) -> None:
    """The pipeline (`SparkpointJob.main` builds the job, reports the run and exits)."""
    from airflow_sparkpoint.sinks import DeltaSink, StageContext

    class FailAfterBatch(DeltaSink):
        """A DeltaSink that raises on every batch after `fail_after_batch`: the
        simulated bug of an unhealthy green. Rebuilt from its config (by the commit
        step) it is a plain DeltaSink."""

        def __init__(self, *args: Any, fail_after_batch: int = -1, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fail_after_batch = fail_after_batch

        def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:
            if 0 <= self.fail_after_batch < ctx.batch_id:
                raise RuntimeError(
                    f"keyed_totals v2: simulated failure in batch {ctx.batch_id} "
                    f"(--fail-after-batch {self.fail_after_batch})"
                )
            return super().stage(df, ctx)

    version = int(job.arg("version", "1"))
    if version not in (1, 2):
        raise SystemExit(f"--version {version} is not supported; expected 1 or 2")
    fail_after = int(job.arg("fail-after-batch", "-1"))
    if fail_after >= 0 and version != 2:
        raise SystemExit("--fail-after-batch only applies to --version 2 (the green job)")
    query = build_query(job.spark, job.arg("input"), version=version,
                        files_per_batch=int(job.arg("files-per-batch", "1")))
    sink = FailAfterBatch(job.arg("output"), mode="merge", keys=["user"], fail_after_batch=fail_after)
    job.run(query, sink=sink, output_mode="update")


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-keyed-totals")
