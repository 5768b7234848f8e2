"""A job's catalog in tests: completed checkpoints written directly (no Spark)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata, TransactionRecord


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
