"""The executor half of `DeltaSink` on S3: each Spark partition becomes parquet files
uploaded as regular objects under the transaction's staging area of the table.

Runs inside Spark's Python workers through ``mapInArrow`` (Spark itself may have no
``s3a`` filesystem); imports only pyarrow, boto3 (via `S3Storage`) and the standard
library. Connection options, credentials included, arrive in the pickled task closure
(`DeltaStageSpec`), never through Spark conf.

Layout, relative to the table root, as Spark's own writer would lay it out::

    _sparkpoint_txn/<job>/<txn>/[<col>=<value>/...]part-<partition>-<attempt>-<n>.snappy.parquet

Partition columns are not stored in the files (Delta keeps them in the add actions).
Names are deterministic per (staging attempt, Spark partition, partition values), so a
retried task overwrites its own files instead of adding more.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

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
class DeltaStageSpec:
    """Everything an executor task needs to stage its partition (pickled into the task)."""

    bucket: str
    table_prefix: str  # "<prefix>/" of the table root, or "" for a table at the bucket root
    staging: str  # "_sparkpoint_txn/<job>/<txn>", relative to the table root
    attempt: str  # unique per staging attempt of the transaction
    partition_by: tuple[str, ...]
    options: Mapping[str, Any] = field(repr=False)  # credentials: never printed

    def relative_path(self, partition: int, values: tuple[str | None, ...], index: int) -> str:
        dirs = "".join(f"{col}={escape_partition_value(v)}/" for col, v in zip(self.partition_by, values, strict=True))
        return f"{self.staging}/{dirs}part-{partition:05d}-{self.attempt}-{index:03d}.snappy.parquet"


class _PartitionWriter:
    """Local parquet files of one Spark partition, one per distinct partition value tuple."""

    def __init__(self, spec: DeltaStageSpec, directory: str) -> None:
        self.spec = spec
        self.directory = directory
        self.writers: dict[tuple[str | None, ...], tuple[str, Any]] = {}
        self.rows: dict[tuple[str | None, ...], int] = {}

    def write(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return
        table = pa.Table.from_batches([batch])
        hidden = [f"{PARTITION_VALUE_COLUMN}{i}" for i in range(len(self.spec.partition_by))]
        data = table.drop_columns([*self.spec.partition_by, *hidden])
        if not hidden:
            self._append((), data)
            return
        groups = table.select(hidden).group_by(hidden).aggregate([])
        for values in groups.to_pylist():
            key = tuple(values[h] for h in hidden)
            mask = None
            for h, v in zip(hidden, key, strict=True):
                cond = pc.is_null(table[h]) if v is None else pc.equal(table[h], v)
                mask = cond if mask is None else pc.and_(mask, cond)
            self._append(key, data.filter(mask))

    def _append(self, key: tuple[str | None, ...], data: Any) -> None:
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


def stage_partition(spec: DeltaStageSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: write this partition's rows as parquet (split by partition
    values), upload each file as a plain object, yield one row per file.

    Consumes `batches` fully (Spark fails a stateful batch whose partitions are not read).
    """
    import pyarrow as pa
    from pyspark import TaskContext

    from airflow_sparkpoint.sinks._s3_stage import _client
    from airflow_sparkpoint.storage.s3 import S3Storage

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    directory = tempfile.mkdtemp(prefix="sparkpoint-delta-")
    rows = []
    try:
        writer = _PartitionWriter(spec, directory)
        try:
            for batch in batches:
                writer.write(batch)
        finally:
            writer.close()
        if not writer.writers:
            return
        store = S3Storage(spec.bucket, spec.table_prefix, client=_client(spec.bucket, spec.options))
        for index, key in enumerate(sorted(writer.writers, key=lambda k: tuple((v is None, v or "") for v in k))):
            local = writer.writers[key][0]
            rel = spec.relative_path(partition, key, index)
            store.upload_file(local, rel)
            rows.append({
                "path": rel,
                "size": os.path.getsize(local),
                # Spark's writer reads an empty partition value back as null; so does Delta.
                "partition_values": json.dumps({c: v or None for c, v in zip(spec.partition_by, key, strict=True)}),
                "num_records": writer.rows[key],
                "modification_time": int(time.time() * 1000),
            })
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    schema = pa.schema([
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),
        ("num_records", pa.int64()),
        ("modification_time", pa.int64()),
    ])
    yield pa.RecordBatch.from_pylist(rows, schema=schema)
