"""One builder per record kind, as the runtime writes them (no Spark): a snapshot's
``_metadata`` (`snapshot_metadata`) and a sink's pre-commit transaction record
(`transaction_record`), and on top of them a completed checkpoint in a job's catalog,
with its files uploaded into ``shared/`` as the checkpointer does (`put_checkpoint`),
transactions a checkpoint confirms (`confirm`), a checkpoint with state files
(`state_checkpoint`), a job's status record (`job_status`, written by `write_status`) and
the ``_metadata`` of a big job (`big_job_metadata`).

Tests of a record type itself (its JSON, parse and bounds: test_metadata.py,
test_bounded_parse.py) and a driver script a test runs in its own process construct it
directly; every other test builds through here."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotKind, SnapshotStats, sha256_hex
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.sinks.base import Sink


def snapshot_metadata(batch: int = 0, *, kind: SnapshotKind = "checkpoint", snapshot_id: int = 1,
                      job: str = "job",
                      generation: int = 1, created_at: float = 0.0, files: Iterable[FileRef] = (),
                      **fields: Any) -> SnapshotMetadata:
    """The ``_metadata`` of snapshot `snapshot_id` (a checkpoint unless `kind` says
    savepoint) of `job` at `batch` by `generation`, referencing `files`; `fields` sets
    any other field (`transactions`, `sink_positions`, `stats`, ...). Nothing is written:
    `put_checkpoint` completes one in a catalog."""
    return SnapshotMetadata(kind=kind, id=snapshot_id, job=job, generation=generation, batch_id=batch,
                            created_at=created_at, files=tuple(files), **fields)


def transaction_record(sink: Sink | str, batch: int = 0, generation: int = 1,
                       staged: Mapping[str, Any] | None = None, *, job: str = "job",
                       sink_id: str | None = None,
                       config: Mapping[str, Any] | None = None, payload: Mapping[str, Any] | None = None,
                       created_at: float | None = None, **extra: Any) -> TransactionRecord:
    """The pre-commit record of `sink` as the runtime writes it after staging `batch` of
    `job` by `generation`: the sink's config, what its stage returned (`staged`, default
    nothing) and `extra` payload keys (``replay``, ``settled_by``), created now unless
    `created_at`.

    `sink` is a `Sink` (its kind, id and config) or a kind's name (then `sink_id` names
    the sink, `config` defaults to empty); `sink_id` and `config` override a Sink's own.
    `payload` replaces the whole payload (`staged` and `extra` are then ignored), for a
    record the runtime would not write (no config, foreign keys). Nothing is written: the
    catalog's `put_transaction` records it."""
    if isinstance(sink, Sink):
        kind, own_id, own_config = sink.kind, sink.sink_id, sink.to_config()
    else:
        kind, own_id, own_config = sink, "", {}
    if payload is None:
        payload = {"config": dict(own_config if config is None else config), "staged": dict(staged or {}),
                   **extra}
    return TransactionRecord(job, batch, generation, kind, own_id if sink_id is None else sink_id,
                             dict(payload), created_at=time.time() if created_at is None else created_at)


def put_checkpoint(
    catalog: Catalog,
    files: Mapping[str, bytes] | None = None,
    *,
    batch_id: int | None = None,
    generation: int | None = None,
    created_at: float | None = None,
    pending: Iterable[TransactionRecord] = (),
    stats: SnapshotStats | None = None,
    checkpoint_id: int | None = None,
) -> SnapshotMetadata:
    """Upload `files` (path → bytes) into shared/ (once per content) and complete a
    checkpoint referencing them that lists `pending` as its pending transactions.

    Defaults: `checkpoint_id` the catalog's next one; `files` one offsets file
    (``offsets/<id>``); `batch_id` the checkpoint's id minus one; `generation` the current
    one (generations are claimed up to a given one); `created_at` now; `stats` 5 ms, every
    file copied."""
    if checkpoint_id is None:
        checkpoint_id = catalog.next_checkpoint_id()
    if files is None:
        files = {f"offsets/{checkpoint_id}": f"offsets of batch {checkpoint_id}".encode()}
    if generation is not None:
        while catalog.current_generation() < generation:
            catalog.claim_generation()
    refs = []
    for path, data in sorted(files.items()):
        sha = sha256_hex(data)
        key = catalog.shared_key(path, sha)
        if not catalog.store.exists(key):
            catalog.store.put(key, data)
        refs.append(FileRef(path=path, key=key, size=len(data), sha256=sha))
    size = sum(map(len, files.values()))
    meta = snapshot_metadata(
        checkpoint_id - 1 if batch_id is None else batch_id,
        snapshot_id=checkpoint_id,
        job=catalog.job,
        generation=catalog.current_generation() if generation is None else generation,
        created_at=time.time() if created_at is None else created_at,
        files=refs,
        stats=stats
        or SnapshotStats(duration_ms=5, bytes_copied=size, files_copied=len(files), bytes_total=size,
                         file_count=len(files)),
        transactions=tuple(pending),
    )
    catalog.complete_checkpoint(meta)
    return meta


def checkpoint_at(catalog: Catalog, batch: int, *, generation: int | None = None,
                  pending: Iterable[TransactionRecord] = ()) -> SnapshotMetadata:
    """`put_checkpoint` without files: a checkpoint of `batch` by `generation` that lists
    `pending` as its pending transactions, so every other record at or below `batch` is
    one the commit step aborts. `generation` defaults to the current one (generation 1
    on a job that never started)."""
    target = generation if generation is not None else max(catalog.current_generation(), 1)
    return put_checkpoint(catalog, {}, batch_id=batch, generation=target, pending=pending)


def state_checkpoint(catalog: Catalog, batch: int, *, duration: int = 10, copied: int = 100,
                     partitions: int = 2, created_at: float | None = None) -> SnapshotMetadata:
    """A completed checkpoint of `batch` by the current generation whose state files span
    `partitions` partitions of operator 0; its stats say `duration` ms and `copied` bytes
    copied in one file."""
    files = {f"offsets/{batch}": f"o{batch}".encode(),
             **{f"state/0/{p}/{batch + 1}.delta": b"s" * (10 + p) for p in range(partitions)}}
    stats = SnapshotStats(duration, copied, 1, sum(map(len, files.values())), len(files))
    return put_checkpoint(catalog, files, batch_id=batch, created_at=created_at, stats=stats)


def job_status(state: str = "running", *, job: str = "job", generation: int = 1,
               started_at: float | None = None, heartbeat_age: float = 0.0, heartbeat_at: float | None = None,
               **fields: Any) -> JobStatus:
    """The status record of `job`'s run of `generation` as the runtime writes it: `state`,
    started a minute ago (at `started_at` when given), its last heartbeat `heartbeat_age`
    seconds ago (at `heartbeat_at` when given), and `fields` (``last_batch``, ``error``,
    ``host``, ``pid``, ``live_dir``, ...). Nothing is written: `write_status` writes one
    into a catalog.

    :raises TypeError: `fields` names a field a status record does not have."""
    now = time.time()
    return JobStatus(job=job, generation=generation, state=state,
                     started_at=now - 60 if started_at is None else started_at,
                     heartbeat_at=now - heartbeat_age if heartbeat_at is None else heartbeat_at, **fields)


def write_status(catalog: Catalog, state: str = "running", *, generation: int | None = None,
                 **fields: Any) -> None:
    """Write the `job_status` record of `catalog`'s job by `generation` (the job's current
    one when None); `fields` as `job_status` takes them (``heartbeat_age``, ``started_at``,
    ``last_batch``, ...)."""
    generation = catalog.current_generation() if generation is None else generation
    catalog.write_status(job_status(state, job=catalog.job, generation=generation, **fields).to_json())


def live_submit_run(catalog: Catalog, dag_id: str, *, token: str | None, run_id: str) -> int:
    """A live generation of the job started by try 1 of task ``submit`` of `dag_id` in DAG
    run `run_id`, by the submit `token` (None: by no submit, as a driver started without
    one claims), on ``worker-9``: its generation number."""
    from airflow_sparkpoint.checkpoints.history_records import generation_details

    env = {"AIRFLOW_CTX_DAG_ID": dag_id, "AIRFLOW_CTX_TASK_ID": "submit", "AIRFLOW_CTX_DAG_RUN_ID": run_id,
           "AIRFLOW_CTX_TRY_NUMBER": "1"}
    submitter = {} if token is None else {"submitter": token}
    generation = catalog.claim_generation({**generation_details(environ=env), **submitter}).generation
    write_status(catalog, host="worker-9", pid=4242)
    return generation


def confirm(catalog: Catalog, *records: TransactionRecord) -> None:
    """Record the transactions and a checkpoint of their last batch that lists them (as the
    coordinator does in ``external`` commit mode)."""
    for r in records:
        catalog.put_transaction(r)
    checkpoint_at(catalog, records[-1].batch_id, generation=records[-1].generation, pending=records)


def big_job_metadata(files: int) -> bytes:
    """The ``_metadata`` of a RocksDB job with `files` SST files (names as Spark writes them)."""
    refs = []
    for i in range(files):
        path = f"state/{i % 4}/{i // 4 % 200}/SSTs/{i:06d}-{uuid.UUID(int=i)}.sst"
        refs.append(FileRef(path, f"shared/{path}~{i:016x}", 64 << 20, f"{i:064x}",
                            1_790_000_000_123_456_789))
    return snapshot_metadata(987654, snapshot_id=12345, job="orders", generation=42, created_at=1.79e9,
                             files=refs).to_bytes()
