"""The executor half of `S3Sink`: one Spark partition becomes one file, uploaded as a
multipart upload that is left pending (the pre-commit).

Runs inside Spark's Python workers through ``mapInArrow``; imports only pyarrow, boto3
(via `S3Storage`) and the standard library. Connection options, credentials included,
arrive in the pickled task closure (`UploadSpec`), never through Spark conf.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.exceptions import SinkError

log = logging.getLogger(__name__)

MiB = 1024 * 1024
#: S3's limits for multipart uploads
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * 1024 * 1024 * MiB
#: format -> file extension
FORMATS = {"parquet": "parquet", "json": "json", "csv": "csv"}
#: concurrent UploadPart requests per executor task
PART_UPLOAD_THREADS = 4
#: what `stage_partition` yields, as Spark DDL
RESULT_DDL = (
    "partition int, key string, upload_id string, "
    "parts array<struct<part_number:int,etag:string>>, size bigint, rows bigint"
)


def choose_part_size(size: int, floor: int | None = None) -> int:
    """The part size for a file of `size` bytes: at least `floor` (default 5 MiB, S3's
    minimum) and large enough for at most 10,000 parts, rounded up to whole MiB.

    :raises SinkError: the file is larger than S3's 5 TiB object limit.
    """
    if size > MAX_OBJECT_SIZE:
        raise SinkError(f"a staged file of {size} bytes exceeds S3's 5 TiB object limit; use more partitions")
    part = max(floor or MIN_PART_SIZE, -(-size // MAX_PARTS))
    return min(-(-part // MiB) * MiB, MAX_PART_SIZE)


@dataclass(frozen=True)
class UploadSpec:
    """Everything an executor task needs to stage its partition (pickled into the task)."""

    bucket: str
    key_prefix: str  # "<prefix>/part-<txn>-"
    fmt: str
    part_size: int | None
    options: Mapping[str, Any] = field(repr=False)  # credentials: never printed

    def key(self, partition: int) -> str:
        return f"{self.key_prefix}{partition:05d}.{FORMATS[self.fmt]}"


_EXECUTOR_CLIENTS: dict[tuple[Any, ...], Any] = {}
_EXECUTOR_CLIENTS_LOCK = threading.Lock()


def executor_client(bucket: str, options: Mapping[str, Any]) -> Any:
    """A boto3 client for an executor task, shared by the tasks of a reused Python worker
    (creating one costs tens of milliseconds)."""
    from airflow_sparkpoint.storage.s3 import S3Storage

    key = (bucket, *sorted((k, str(v)) for k, v in options.items()))
    with _EXECUTOR_CLIENTS_LOCK:
        client = _EXECUTOR_CLIENTS.get(key)
        if client is None:
            client = _EXECUTOR_CLIENTS[key] = S3Storage(bucket, "", **dict(options)).client
    return client


#: marks a decimal while json.dumps runs, so that it is written as an exact JSON number
_DECIMAL_MARK = f"\x00sparkpoint-decimal-{uuid.uuid4().hex}:"
_DECIMAL_RE = re.compile('"' + re.escape(json.dumps(_DECIMAL_MARK)[1:-1]) + r'([-0-9.]+)"')


def _json_default(value: Any) -> Any:
    import base64
    import datetime

    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")  # what Spark's JSON writer does
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _plain(value: Any, typ: Any) -> Any:
    """`value` (from ``to_pylist``) shaped as Spark's JSON writer shapes it: maps as
    objects, null struct fields left out, decimals exact."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(typ):
        return {str(k): _plain(v, typ.item_type) for k, v in value}
    if pa.types.is_struct(typ):
        fields = (typ.field(i) for i in range(typ.num_fields))
        return {f.name: _plain(value[f.name], f.type) for f in fields if value.get(f.name) is not None}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_plain(v, typ.value_type) for v in value]
    if pa.types.is_decimal(typ):
        return _DECIMAL_MARK + format(value, "f")
    return value


def _json_lines(batch: Any) -> Iterator[str]:
    """One JSON object per row, the layout Spark's JSON writer uses."""
    schema = batch.schema
    for row in batch.to_pylist():
        plain = {f.name: _plain(row[f.name], f.type) for f in schema if row[f.name] is not None}
        text = json.dumps(plain, default=_json_default, ensure_ascii=False)
        if _DECIMAL_MARK[1:] in text:
            text = _DECIMAL_RE.sub(r"\1", text)
        yield text + "\n"


def _write_partition(fmt: str, batches: Iterator[Any], path: str) -> int:
    """Write every record batch to one local file in `fmt`; return the row count.

    Consumes `batches` fully (Spark fails a stateful batch whose partitions are not read).
    """
    import pyarrow as pa

    rows = 0
    writer: Any = None
    try:
        for batch in batches:
            if writer is None:
                if fmt == "parquet":
                    import pyarrow.parquet as pq

                    writer = pq.ParquetWriter(path, batch.schema, compression="snappy")
                elif fmt == "csv":
                    import pyarrow.csv as pcsv

                    writer = pcsv.CSVWriter(path, batch.schema)
                else:
                    writer = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            if batch.num_rows == 0:
                continue
            rows += batch.num_rows
            if fmt == "json":
                writer.writelines(_json_lines(batch))
            else:
                writer.write(pa.Table.from_batches([batch]) if fmt == "parquet" else batch)
    finally:
        if writer is not None:
            writer.close()
    return rows


def _upload_parts(client: Any, bucket: str, key: str, path: str, size: int,
                  part_size: int) -> tuple[str, list[Any]]:
    """Upload `path` as the parts of a new multipart upload that is left pending."""
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    count = max(1, -(-size // part_size))

    def upload(number: int) -> tuple[int, str]:
        with open(path, "rb") as handle:
            handle.seek((number - 1) * part_size)
            body = handle.read(part_size)
        response = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                      Body=body)
        return number, str(response["ETag"])

    try:
        with ThreadPoolExecutor(max_workers=min(PART_UPLOAD_THREADS, count)) as pool:
            parts = sorted(pool.map(upload, range(1, count + 1)))
    except BaseException:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the original error matters; cleanup_orphans retries
            log.warning("could not abort the failed upload %s of s3://%s/%s", upload_id, bucket, key)
        raise
    return upload_id, [list(p) for p in parts]


def stage_partition(spec: UploadSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: write this partition to a temp file, upload it as a pending
    multipart upload, yield one row describing it (nothing for an empty partition)."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    fd, path = tempfile.mkstemp(prefix="sparkpoint-s3-", suffix=f".{FORMATS[spec.fmt]}")
    os.close(fd)
    try:
        rows = _write_partition(spec.fmt, batches, path)
        if rows == 0:
            return
        size = os.path.getsize(path)
        key = spec.key(partition)
        part_size = choose_part_size(size, spec.part_size)
        upload_id, parts = _upload_parts(executor_client(spec.bucket, spec.options), spec.bucket, key, path,
                                         size, part_size)
    finally:
        os.unlink(path)
    row = {
        "partition": partition,
        "key": key,
        "upload_id": upload_id,
        "parts": [{"part_number": n, "etag": e} for n, e in parts],
        "size": size,
        "rows": rows,
    }
    schema = pa.schema([
        ("partition", pa.int32()),
        ("key", pa.string()),
        ("upload_id", pa.string()),
        ("parts", pa.list_(pa.struct([("part_number", pa.int32()), ("etag", pa.string())]))),
        ("size", pa.int64()),
        ("rows", pa.int64()),
    ])
    yield pa.RecordBatch.from_pylist([row], schema=schema)
