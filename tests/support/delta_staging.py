"""The two staging sides of `DeltaSink`, for its test modules: an autouse fixture runs
every test once with batches staged from the driver and once by the executors, and
`stage` does what the runtime does in ``foreachBatch`` on the side of the running test.
Without Spark, `staged` leaves what `DeltaSink.stage` leaves for a batch of (user,
total) rows, and `table_rows` reads such a table back.

A test module opts in with ``from tests.support.delta_staging import staging_side  # noqa: F401``.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_sparkpoint.checkpoints import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.sinks import DeltaSink, StageContext
from tests.support.records import snapshot_metadata, transaction_record

JOB = "job"  # the job of the batches `staged` makes
SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64())])

#: ``spark.sparkpoint.delta.driverStagingMaxBytes`` that selects each side
DRIVER_MAX_BYTES = {"driver": 32 * 1024 * 1024, "executors": 0}
SIDE = "driver"  # the side of the running test, set by `staging_side`


def side() -> str:
    """The staging side of the running test."""
    return SIDE


@pytest.fixture(autouse=True, params=["driver", "executors"])
def staging_side(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Run the test with its batches staged from the driver, then by the executors; the
    sides that actually wrote are recorded, so a test cannot pass on the other one."""
    from airflow_sparkpoint.sinks._delta_location import TableLocation

    monkeypatch.setattr(sys.modules[__name__], "SIDE", request.param)
    wrote: list[str] = []
    for method, label in (("_stage_from_driver", "driver"), ("_stage_on_executors", "executors")):
        for cls in TableLocation.__subclasses__():
            original = getattr(cls, method)

            def spy(self: Any, *args: Any, _original: Any = original, _label: str = label) -> Any:
                wrote.append(_label)
                return _original(self, *args)

            monkeypatch.setattr(cls, method, spy)
    yield wrote
    assert set(wrote) <= {request.param}, f"staged by {wrote} in a {request.param} test"


def sized(df: Any) -> Any:
    """`df` as a local relation, whose size Spark knows (it plans a DataFrame created from
    a Python list as an RDD of unknown size, which the sink stages on the executors).
    PySpark 3.5 cannot create a DataFrame from an Arrow table: there a materialized cache,
    whose size Spark knows too."""
    from airflow_sparkpoint.sinks.spark_compat import collect_arrow, spark_line

    if spark_line(df.sparkSession.version) >= (4, 0):
        return df.sparkSession.createDataFrame(collect_arrow(df))
    cached = df.cache()
    cached.count()
    return cached


def stage(sink: DeltaSink, df: Any, batch: int, generation: int = 1, job: str = "job",
          options: dict[str, Any] | None = None) -> TransactionRecord:
    """What the runtime does in foreachBatch: stage on the test's side, then build the
    pre-commit record."""
    ctx = StageContext(job, batch, generation, options or {}, DRIVER_MAX_BYTES[SIDE])
    payload = sink.stage(sized(df) if SIDE == "driver" else df, ctx)
    return transaction_record(sink, batch, generation, payload, job=job)


def staged(sink: DeltaSink, batch: int, generation: int, rows: list[tuple[str, int]]) -> TransactionRecord:
    """What `DeltaSink.stage` leaves behind for one batch of job `JOB` (one Parquet file of
    `rows`, none when empty), and its pre-commit record."""
    txn = f"{JOB}-b{batch}-g{generation}"
    staging = f"_sparkpoint_txn/{JOB}/{txn}"
    os.makedirs(os.path.join(sink.path, staging), exist_ok=True)
    path = f"{staging}/part-00000-{txn}.snappy.parquet"
    table = pa.table({"user": [r[0] for r in rows], "total": [r[1] for r in rows]}, schema=SCHEMA)
    pq.write_table(table, os.path.join(sink.path, path), compression="snappy")
    files = [{"path": path, "size": os.path.getsize(os.path.join(sink.path, path)), "partition_values": {},
              "num_records": len(rows), "modification_time": int(time.time() * 1000)}] if rows else []
    payload = {"mode": sink.mode, "staging": staging, "files": files, "rows": len(rows),
               "schema": base64.b64encode(SCHEMA.serialize().to_pybytes()).decode("ascii")}
    return transaction_record(sink, batch, generation, payload, job=JOB)


def rewind_target(sink: DeltaSink, batch: int, version: int | None) -> SnapshotMetadata:
    """A savepoint of job ``job`` at `batch` that saw `sink` at table `version` (`None`:
    a savepoint from before the sink recorded positions), for `DeltaSink.rewind`."""
    positions = {} if version is None else {sink.sink_id: {"batch": version, "version": version}}
    return snapshot_metadata(batch, kind="savepoint", sink_positions=positions)


def table_rows(sink: DeltaSink) -> list[tuple[str, int]]:
    """The (user, total) rows of the Delta table of `sink`, sorted."""
    from deltalake import DeltaTable

    return sorted((r["user"], r["total"]) for r in DeltaTable(sink.path).to_pyarrow_table().to_pylist())
