"""Restore drill without the application (``sparkpoint verify``).

`verify_snapshot` materializes a snapshot into a private scratch directory, checks
every file it references (size and sha256 against ``_metadata``), then opens every
state store of every operator and partition with Spark's ``statestore`` data source and
reads all of it (every column of every row is hashed, so nothing is skipped). It never
raises for a bad snapshot: the outcome says what failed. `record_verification` writes
the outcome next to the snapshot (``_verification.json``, level ``state``); neither
writes to a sink or claims a generation of the job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.snapshot_open import snapshot_at, stored_sizes
from airflow_sparkpoint.checkpoints.verification import VerificationRecord, write_verification
from airflow_sparkpoint.exceptions import (
    CorruptMetadata,
    InvalidPath,
    RestoreError,
    SparkpointError,
    StorageError,
    VerificationFailed,
)
from airflow_sparkpoint.runtime.restore import materialize
from airflow_sparkpoint.runtime.state_inspect import SnapshotReader, first_line, read_store, resolve_snapshot
from airflow_sparkpoint.storage import Storage, open_storage
from airflow_sparkpoint.storage.localfs import open_path, remove_tree_at

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["VerifyResult", "check_files", "check_presence", "check_state", "default_verifier",
           "load_snapshot", "record_location", "record_verification", "verify", "verify_snapshot"]

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_MAX_LISTED = 5  # file problems named in one message


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of `verify_snapshot` (``sparkpoint verify --json`` without job/root)."""

    uri: str
    kind: str | None  # None: the _metadata itself is unreadable
    batch_id: int | None
    ok: bool
    error: str | None
    verified_at: float
    duration_s: float
    checks: Mapping[str, Any] = field(default_factory=dict)
    # False: no _metadata at `uri` (an incomplete or abandoned directory, or nothing):
    # there is no snapshot to record the outcome next to.
    found: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "kind": self.kind, "batch_id": self.batch_id, "ok": self.ok,
                "error": self.error,
                "verified_at": self.verified_at, "duration_s": round(self.duration_s, 3),
                "checks": dict(self.checks)}

    def record(self, level: str = "state", verified_by: str = "") -> VerificationRecord:
        return VerificationRecord(verified_at=self.verified_at, level=level,
                                  duration_s=round(self.duration_s, 3),
                                  checks=dict(self.checks), error=self.error,
                                  verified_by=verified_by or default_verifier())


def default_verifier() -> str:
    return f"sparkpoint-verify@{socket.gethostname()}:{os.getpid()}"


def _sha256_and_size(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    handle, _st = open_path(path)  # the scratch copy: a regular file, or refused
    with handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _fail_listing(handle: SnapshotHandle, problems: list[str]) -> None:
    if problems:
        listed = "; ".join(problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise VerificationFailed(
            f"{handle.uri}: {len(problems)} referenced file(s) failed the check: {listed}{more}")


def check_presence(handle: SnapshotHandle) -> None:
    """Every referenced file exists with its recorded size (one listing per top-level
    directory of the keys, like `open_snapshot`).

    :raises VerificationFailed: naming every file (up to a few) that is missing or has another size.
    """
    found = stored_sizes(handle.files_store, handle.metadata.files, missing_on=(StorageError,))
    problems = [problem for ref, size in found if (problem := ref.stored_problem(size)) is not None]
    _fail_listing(handle, problems)


def check_files(handle: SnapshotHandle, location: str) -> tuple[int, int]:
    """Every referenced file, as materialized at `location`, has the size and sha256
    that ``_metadata`` records. Returns (files, bytes).

    `materialize` rewrites the snapshot's absolute paths in a few small files (the
    transformWithState schema file paths): for a file that differs locally the stored
    bytes are read again and checked instead.

    :raises VerificationFailed: naming every file (up to a few) that is missing, truncated or altered.
    """
    problems = []
    total = 0
    for ref in handle.metadata.files:
        local = os.path.join(location, *ref.path.split("/"))
        try:
            digest, size = _sha256_and_size(local)
        except (FileNotFoundError, InvalidPath):
            digest, size = "", -1
        if size == ref.size and digest == ref.sha256:
            total += size
            continue
        try:
            # one larger than recorded is wrong: never read whole
            data = handle.files_store.get(ref.key, ref.size)
        except StorageError as exc:
            problems.append(f"{ref.key} cannot be read ({exc})")
            continue
        if len(data) != ref.size:
            problems.append(f"{ref.key} has {len(data)} bytes, expected {ref.size}")
        elif hashlib.sha256(data).hexdigest() != ref.sha256:
            problems.append(f"{ref.key} is corrupt: its sha256 is "
                            f"{hashlib.sha256(data).hexdigest()[:16]}..., "
                            f"expected {ref.sha256[:16]}...")
        else:
            total += len(data)
    _fail_listing(handle, problems)
    return len(handle.metadata.files), total


def check_state(spark: SparkSession, handle: SnapshotHandle, location: str) -> dict[str, int]:
    """Open every store of every operator (all partitions) at the snapshot's batch and
    read every row. Returns counts (operators, partitions, stores, rows).

    :raises VerificationFailed: naming the operator and store that cannot be read, or an operator
        whose state files do not cover all of its partitions.
    """
    from pyspark.sql import functions as F

    reader = SnapshotReader(spark, handle, location=location)
    with reader:
        if not reader.stateful:
            return {"operators": 0, "partitions": 0, "stores": 0, "rows": 0}
        try:
            specs = reader.operator_specs()
        except Exception as exc:
            raise VerificationFailed(
                f"{handle.uri}: the operator metadata cannot be read: {first_line(exc)}") from exc
        on_disk = handle.metadata.partitions_by_operator
        counts = {"operators": len(specs), "partitions": 0, "stores": 0, "rows": 0}
        for op in specs:
            if on_disk.get(op.id) != op.partitions:
                raise VerificationFailed(f"{handle.uri}: operator {op.id} ({op.name}) has "
                              f"{op.partitions} state partitions but "
                              f"the snapshot holds state files for {on_disk.get(op.id, 0)} of them")
            counts["partitions"] += op.partitions
            for spec in op.physical:
                where = f"operator {op.id} ({op.name}) store {spec.name}"
                try:
                    df = read_store(spark, location, handle.metadata.batch_id, op, spec)
                    planned = df.rdd.getNumPartitions()
                    if planned != op.partitions:
                        raise VerificationFailed(
                            f"{handle.uri}: {where}: {planned} of {op.partitions} partitions found")
                    # Hash every column so that every value is read and decoded, not just counted.
                    row = df.agg(F.count(F.lit(1)).alias("n"),
                                 F.bit_xor(F.xxhash64(*df.columns)).alias("h")).first()
                    assert row is not None  # an aggregate without grouping has one row
                except VerificationFailed:
                    raise
                except Exception as exc:
                    raise VerificationFailed(
                        f"{handle.uri}: {where} cannot be read: {first_line(exc)}") from exc
                counts["stores"] += 1
                counts["rows"] += int(row["n"])
        return counts


def verify_snapshot(
    handle: SnapshotHandle,
    *,
    spark: SparkSession | Callable[[], SparkSession] | None = None,
    scratch_dir: str | None = None,
) -> VerifyResult:
    """Check the files of `handle` and read all of its state (see the module docstring).

    `spark` is a session or a function returning one (called only when there is state
    to read; default: `airflow_sparkpoint.runtime.state_inspect.local_session`). Never raises
    for a bad snapshot: ``ok`` is False and ``error`` says what failed.
    """
    from airflow_sparkpoint.runtime.state_inspect import local_session

    started = time.monotonic()
    verified_at = time.time()
    meta = handle.metadata
    checks: dict[str, Any] = {"files": 0, "bytes": 0, "operators": 0, "partitions": 0, "stores": 0, "rows": 0}
    error: str | None = None
    scratch = tempfile.mkdtemp(prefix="sparkpoint-verify-", dir=scratch_dir)
    try:
        location = os.path.join(scratch, "checkpoint")
        check_presence(handle)
        try:
            materialize(handle, location, stored=False)
        except (SparkpointError, OSError) as exc:
            # A missing object aborts the download: say which file, as check_files would.
            raise VerificationFailed(f"{handle.uri}: cannot materialize the snapshot: {exc}") from exc
        checks["files"], checks["bytes"] = check_files(handle, location)
        if meta.partitions_by_operator:
            session = spark() if callable(spark) else (spark or local_session("sparkpoint-verify"))
            checks.update(check_state(session, handle, location))
    except VerificationFailed as exc:
        error = str(exc)
    finally:
        remove_tree_at(scratch)
    duration = time.monotonic() - started
    if error:
        log.warning("verification of %s failed: %s", handle.uri, error)
    else:
        log.info("verified %s: %s", handle.uri, checks)
    return VerifyResult(handle.uri, meta.kind, meta.batch_id, error is None, error, verified_at, duration,
                        checks)


def record_location(uri: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Storage, str]:
    """The store and key under which the verification record of the snapshot directory
    `uri` lives (its parent directory and its name: the same object the catalog reads
    as ``<job root>/<snapshot key>/_verification.json``)."""
    text = uri.rstrip("/")
    parent, _, name = text.rpartition("/")
    if not parent or not name:
        raise SparkpointError(f"cannot locate the directory of snapshot {uri!r}")
    if parent.endswith((":/", ":")):  # file:///x -> parent 'file://'
        parent = parent + "/"
    return open_storage(parent, **dict(storage_options or {})), name


def record_verification(
    uri: str,
    record: VerificationRecord,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Write `record` next to the snapshot at `uri` (replacing an earlier one).

    :raises StorageError: the record cannot be written.
    """
    store, key = record_location(uri, storage_options)
    write_verification(store, key, record)


def load_snapshot(uri: str, *, storage_options: Mapping[str, Any] | None = None) -> SnapshotHandle:
    """A handle on the snapshot directory `uri` from its ``_metadata`` alone, without
    checking the files it references (`verify_snapshot` does, naming every bad one).

    :raises RestoreError: there is no ``_metadata`` at `uri` (not a snapshot).
    :raises CorruptMetadata: ``_metadata`` is there but fails its checksum or schema, or
        is over its size limit.
    """
    return snapshot_at(uri, storage_options=storage_options)


def verify(
    target: str | SnapshotHandle,
    *,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
    spark: SparkSession | Callable[[], SparkSession] | None = None,
    scratch_dir: str | None = None,
) -> VerifyResult:
    """Resolve `target` like `airflow_sparkpoint.runtime.state_inspect.resolve_snapshot`
    (``latest``, a URI or path, or a key under the catalog's job root) and verify it.

    A path or key with no ``_metadata`` (an incomplete or abandoned checkpoint, or
    nothing at all) is a failed verification with ``found`` false: not recorded.

    :raises RestoreError: ``latest`` of a job without a valid checkpoint (no path to name).
    """
    if isinstance(target, SnapshotHandle) or str(target).strip() == "latest":
        handle = resolve_snapshot(target, catalog=catalog, storage_options=storage_options)
    else:
        text = str(target).strip()
        if "://" not in text and not text.startswith("/") and catalog is not None:
            text = f"{catalog.uri}/{text.strip('/')}"
        try:
            handle = load_snapshot(text, storage_options=storage_options)
        except CorruptMetadata as exc:
            return VerifyResult(text.rstrip("/"), None, None, False, str(exc), time.time(), 0.0, {})
        except RestoreError as exc:  # no _metadata
            return VerifyResult(text.rstrip("/"), None, None, False, str(exc), time.time(), 0.0, {},
                                found=False)
    return verify_snapshot(handle, spark=spark, scratch_dir=scratch_dir)
