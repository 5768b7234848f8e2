"""Staging a `DeltaSink` batch with pyarrow: the parquet files of one transaction under
its staging area, written either by the driver (a small batch collected as Arrow) or by
each executor task (``mapInArrow``, on S3, where Spark may have no ``s3a`` filesystem).

The executor half imports only pyarrow, boto3 (via `S3Storage`) and the standard
library. Connection options, credentials included, arrive in the pickled task closure
(`DeltaStageSpec`), never through Spark conf.

Layout, relative to the table root, as Spark's own writer would lay it out::

    _sparkpoint_txn/<job>/<txn>/[<col>=<value>/...]part-<partition>-<attempt>-<n>.snappy.parquet

Partition columns are not stored in the files (Delta keeps them in the add actions).
Names are deterministic per (staging attempt, Spark partition, partition values), so a
retried task overwrites its own files instead of adding more.

Which side writes (`stage_on_driver`): the driver, when Spark's size estimate of the
batch's plan is known and at most ``spark.sparkpoint.delta.driverStagingMaxBytes``. That
saves a second round of task and file-commit overhead per batch, which dominates small
micro-batches. Larger or unknown batches are written by the executors in parallel; a
batch that turns out too large to collect (``spark.driver.maxResultSize``) is written by
the executors instead, and so is every later batch of that sink.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.storage.localfs import Dir, remove_tree_at

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: prefix of the hidden columns that carry each row's partition values as strings
PARTITION_VALUE_COLUMN = "__sparkpoint_pv_"
#: what `stage_partition` yields, as Spark DDL
RESULT_DDL = "path string, size bigint, partition_values string, num_records bigint, modification_time bigint"
#: Spark's name for a null (or empty) partition value in a directory name
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Characters Spark's ExternalCatalogUtils.escapePathName escapes in partition directories.
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^') | frozenset(chr(c) for c in range(0x20))


def escape_partition_value(value: str | None) -> str:
    """A partition value as Spark writes it in a directory name (``%XX`` escapes)."""
    if value is None or value == "":
        return HIVE_DEFAULT_PARTITION
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


@dataclass(frozen=True)
class StageLayout:
    """Where the files of one staging attempt of a transaction go."""

    staging: str  # "_sparkpoint_txn/<job>/<txn>", relative to the table root
    attempt: str  # unique per staging attempt of the transaction
    partition_by: tuple[str, ...]

    def relative_path(self, partition: int, values: tuple[str | None, ...], index: int) -> str:
        dirs = "".join(f"{col}={escape_partition_value(v)}/"
                       for col, v in zip(self.partition_by, values, strict=True))
        return f"{self.staging}/{dirs}part-{partition:05d}-{self.attempt}-{index:03d}.snappy.parquet"


@dataclass(frozen=True)
class DeltaStageSpec:
    """Everything an executor task needs to stage its partition on S3 (pickled into the task)."""

    layout: StageLayout
    bucket: str
    table_prefix: str  # "<prefix>/" of the table root, or "" for a table at the bucket root
    options: Mapping[str, Any] = field(repr=False)  # credentials: never printed


class PartitionWriter:
    """Local parquet files of rows with hidden partition-value columns, one file per
    distinct partition value tuple, in `directory`."""

    def __init__(self, partition_by: Sequence[str], directory: str) -> None:
        self.partition_by = tuple(partition_by)
        self.directory = directory
        self.writers: dict[tuple[str | None, ...], tuple[str, Any]] = {}
        self.rows: dict[tuple[str | None, ...], int] = {}

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if data.num_rows == 0:
            return
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        hidden = [f"{PARTITION_VALUE_COLUMN}{i}" for i in range(len(self.partition_by))]
        rows = table.drop_columns([*self.partition_by, *hidden])
        if not hidden:
            self._append((), rows)
            return
        groups = table.select(hidden).group_by(hidden).aggregate([])
        for values in groups.to_pylist():
            key = tuple(values[h] for h in hidden)
            mask = None
            for h, v in zip(hidden, key, strict=True):
                cond = pc.is_null(table[h]) if v is None else pc.equal(table[h], v)
                mask = cond if mask is None else pc.and_(mask, cond)
            self._append(key, rows.filter(mask))

    def _append(self, key: tuple[str | None, ...], data: pa.Table) -> None:
        import pyarrow.parquet as pq

        entry = self.writers.get(key)
        if entry is None:
            path = os.path.join(self.directory, f"{len(self.writers)}.parquet")
            entry = self.writers[key] = (path, pq.ParquetWriter(path, data.schema, compression="snappy"))
            self.rows[key] = 0
        entry[1].write_table(data)
        self.rows[key] += data.num_rows

    def close(self) -> None:
        for _path, writer in self.writers.values():
            writer.close()

    def place(self, layout: StageLayout, partition: int,
              put: Callable[[str, str], None]) -> list[dict[str, Any]]:
        """Hand every closed file to ``put(local_path, relative_path)`` under `layout` and
        describe it as ``{path, size, partition_values, num_records, modification_time}``."""
        files = []
        ordered = sorted(self.writers, key=lambda k: tuple((v is None, v or "") for v in k))
        for index, key in enumerate(ordered):
            local = self.writers[key][0]
            rel = layout.relative_path(partition, key, index)
            size = os.path.getsize(local)
            put(local, rel)
            files.append({
                "path": rel,
                "size": size,
                # Spark's writer reads an empty partition value back as null; so does Delta.
                "partition_values": {c: v or None for c, v in zip(self.partition_by, key, strict=True)},
                "num_records": self.rows[key],
                "modification_time": int(time.time() * 1000),
            })
        return files


def stage_partition(spec: DeltaStageSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: write this partition's rows as parquet (split by partition
    values), upload each file as a plain object, yield one row per file.

    Consumes `batches` fully (Spark fails a stateful batch whose partitions are not read).
    """
    import pyarrow as pa
    from pyspark import TaskContext

    from airflow_sparkpoint.sinks._s3_stage import executor_client
    from airflow_sparkpoint.storage.s3 import S3Storage

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    directory = tempfile.mkdtemp(prefix="sparkpoint-delta-")
    files: list[dict[str, Any]] = []
    try:
        writer = PartitionWriter(spec.layout.partition_by, directory)
        try:
            for batch in batches:
                writer.write(batch)
        finally:
            writer.close()
        if not writer.writers:
            return
        store = S3Storage(spec.bucket, spec.table_prefix, client=executor_client(spec.bucket, spec.options))
        files = writer.place(spec.layout, partition, store.upload_file)
    finally:
        remove_tree_at(directory)
    schema = pa.schema([
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),
        ("num_records", pa.int64()),
        ("modification_time", pa.int64()),
    ])
    yield pa.RecordBatch.from_pylist(
        [{**f, "partition_values": json.dumps(f["partition_values"])} for f in files], schema=schema)


# -- the driver side ---------------------------------------------------------------------------


def with_partition_values(df: DataFrame, partition_by: Sequence[str]) -> DataFrame:
    """`df` plus one hidden string column per partition column: the value as Spark
    renders it in a directory name (its cast to string)."""
    if not partition_by:
        return df
    from pyspark.sql import functions as F

    values = [F.col("`" + col.replace("`", "``") + "`").cast("string").alias(f"{PARTITION_VALUE_COLUMN}{i}")
              for i, col in enumerate(partition_by)]
    return df.select("*", *values)


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of `df`'s optimized plan, or None when Spark does not know it
    (a source without statistics is planned at ``spark.sql.defaultSizeInBytes``)."""
    try:
        size = int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
        unknown = int(df._jdf.sparkSession().sessionState().conf().defaultSizeInBytes())
    except Exception as exc:  # noqa: BLE001 - an estimate is an optimisation, never a failure
        log.debug("no size estimate for the batch: %s", exc)
        return None
    return None if size >= unknown else size


def stage_on_driver(df: DataFrame, max_bytes: int) -> bool:
    """Whether the batch is small enough to collect to the driver and write there."""
    if max_bytes <= 0:
        return False
    size = estimated_bytes(df)
    return size is not None and size <= max_bytes


def result_too_large(exc: BaseException) -> bool:
    """Whether collecting a batch failed only because it is too large for the driver."""
    return isinstance(exc, MemoryError) or "maxResultSize" in str(exc)


def collect_and_write(df: DataFrame, layout: StageLayout, directory: str,
                      put: Callable[[str, str], None]) -> list[dict[str, Any]] | None:
    """Collect `df` (with its hidden partition-value columns) as Arrow, write it as
    parquet under `directory` and hand each file to `put`. Returns None, having written
    nothing, when the batch is too large to collect (`result_too_large`).

    :raises Exception: whatever Spark raised for any other failure of the batch.
    """
    from airflow_sparkpoint.sinks import spark_compat  # the driver half only (see the module docstring)

    try:
        table = spark_compat.collect_arrow(df)
    except Exception as exc:
        if not result_too_large(exc):
            raise
        log.warning("batch too large to stage from the driver (%s); the executors write it",
                    str(exc).splitlines()[0][:300])
        return None
    writer = PartitionWriter(layout.partition_by, directory)
    try:
        writer.write(table)
    finally:
        writer.close()
    del table
    return sorted(writer.place(layout, 0, put), key=lambda f: f["path"])


def describe_spark_files(root: Dir, staging: str) -> list[dict[str, Any]]:
    """The parquet files Spark's writer left under `staging` of the table `root`, as
    ``{path, size, partition_values, num_records, modification_time}`` sorted by path
    (regular files only, never through a link; hidden names skipped).

    :raises InvalidPath: `staging` or a directory on its way is a link.
    """
    import pyarrow.parquet as pq

    files = []
    for rel, st in sorted(root.walk_files(staging, skip=lambda name, _dir: name.startswith((".", "_")))):
        if not rel.endswith(".parquet"):
            continue
        partition_values = {}
        for segment in rel.split("/")[:-1]:
            col, _, value = segment.partition("=")
            value = urllib.parse.unquote(value)
            partition_values[col] = None if value == "__HIVE_DEFAULT_PARTITION__" else value
        handle, _st = root.open_file(f"{staging}/{rel}")
        with handle:
            num_records = pq.read_metadata(handle).num_rows
        files.append({"path": f"{staging}/{rel}", "size": st.st_size, "partition_values": partition_values,
                      "num_records": num_records, "modification_time": int(st.st_mtime * 1000)})
    return files
