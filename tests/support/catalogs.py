"""A job's catalog in tests: completed checkpoints written directly (no Spark)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotStats, sha256_hex


def checkpoint_at(catalog: Catalog, batch: int, *, generation: int | None = None,
                  pending: Iterable[TransactionRecord] = ()) -> SnapshotMetadata:
    """Complete a checkpoint (no files) of `batch` by `generation` that lists `pending`
    as its pending transactions: every other record at or below `batch` is one the
    commit step aborts. Generations are claimed up to `generation` (default: the
    current one; generation 1 on a job that never started)."""
    target = generation if generation is not None else max(catalog.current_generation(), 1)
    while catalog.current_generation() < target:
        catalog.claim_generation()
    meta = SnapshotMetadata(kind="checkpoint", id=catalog.next_checkpoint_id(), job=catalog.job, generation=target,
                            batch_id=batch, created_at=time.time(), files=(), transactions=tuple(pending))
    catalog.complete_checkpoint(meta)
    return meta


def put_checkpoint(
    catalog: Catalog,
    files: dict[str, bytes],
    *,
    batch_id: int | None = None,
    generation: int | None = None,
    created_at: float | None = None,
) -> SnapshotMetadata:
    """Upload `files` (path → bytes) into shared/ (once per content) and complete a
    checkpoint referencing them, as the runtime's coordinator does."""
    refs = []
    for path, data in sorted(files.items()):
        sha = sha256_hex(data)
        key = catalog.shared_key(path, sha)
        if not catalog.store.exists(key):
            catalog.store.put(key, data)
        refs.append(FileRef(path=path, key=key, size=len(data), sha256=sha))
    checkpoint_id = catalog.next_checkpoint_id()
    meta = SnapshotMetadata(
        kind="checkpoint",
        id=checkpoint_id,
        job=catalog.job,
        generation=catalog.current_generation() if generation is None else generation,
        batch_id=checkpoint_id - 1 if batch_id is None else batch_id,
        created_at=time.time() if created_at is None else created_at,
        files=tuple(refs),
        stats=SnapshotStats(duration_ms=5, bytes_copied=sum(map(len, files.values())), files_copied=len(files),
                            bytes_total=sum(map(len, files.values())), file_count=len(files)),
    )
    catalog.complete_checkpoint(meta)
    return meta
