"""The generation claims of a job (``generations/<g>``): one object per start, created
exclusively (racing starters get distinct generations), never deleted. The one writer
and reader of the `GenerationInfo` record; `Catalog` exposes them as methods.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.entries import GenerationInfo
from airflow_sparkpoint.exceptions import (
    ObjectExists,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.storage import Storage

__all__ = ["check_generation", "claim_generation", "claimed_generations", "newest_generation", "read_claim"]


def claimed_generations(store: Storage) -> list[int]:
    """Every claimed generation of the job whose keys `store` holds, in order (one listing)."""
    numbers = (layout.generation_of(info.key) for info in store.list(layout.GENERATIONS))
    return sorted(g for g in numbers if g is not None)


def newest_generation(store: Storage, known: int = 0) -> int:
    """The newest claimed generation (0: none), given `known`, one known to exist (0:
    none known). Claims are contiguous from 1 (each is ``current + 1``, created
    exclusively) and never deleted, so existence checks find it: one when nothing is newer
    than `known`, a few more per doubling otherwise. Without `known`, one page of the
    listing (`layout.GENERATIONS_LISTED` claims, sorted: their keys are zero-padded) goes
    first: a job started every few minutes claims ≈ 100,000 a year, and a listing of all of
    them was read at every status read."""
    if known <= 0:
        for count, info in enumerate(store.list(layout.GENERATIONS), 1):
            known = max(known, layout.generation_of(info.key) or 0)
            if count >= layout.GENERATIONS_LISTED:
                break
        else:
            return known  # the whole listing: that is all of them
    low, step = known, 1  # `low` exists; find one that does not, doubling the step
    high = low + step
    while store.exists(layout.generation_key(high)):
        low, step = high, step * 2
        high = low + step
    while high - low > 1:  # `low` exists, `high` does not
        middle = (low + high) // 2
        if store.exists(layout.generation_key(middle)):
            low = middle
        else:
            high = middle
    return low


def claim_generation(store: Storage, job: str, details: Mapping[str, Any] | None = None) -> GenerationInfo:
    """Atomically claim generation ``current + 1`` and record `details` with it.

    :raises StorageError: no generation could be claimed after 1000 attempts.
    :raises CatalogError: the claim would be over its limits (`layout.limits_of`): its
        details are too big; nothing is claimed.
    """
    newest = 0
    for _ in range(1000):
        newest = newest_generation(store, newest)
        info = GenerationInfo(newest + 1, time.time(), socket.gethostname(), os.getpid(), dict(details or {}))
        key = layout.generation_key(info.generation)
        body = json.dumps(info.to_json()).encode()
        bounded.check_writable(body, layout.limits_of(key), f"{store.uri}/{key}")
        try:
            store.put_if_absent(key, body)
        except ObjectExists:
            continue
        return info
    raise StorageError(f"could not claim a generation for job {job!r} after 1000 attempts")


def read_claim(store: Storage, where: str, generation: int) -> GenerationInfo | None:
    """The claim of `generation`, or None when it was never claimed (`where`: the job's
    URI, for messages).

    :raises CorruptMetadata: the claim is unreadable (`CorruptRecord`: not JSON, over its
        limits, wrong fields, another generation's).
    :raises StorageError: the store cannot be read.
    """
    key = layout.generation_key(generation)
    return bounded.read_record(store, key, lambda raw: GenerationInfo.from_json(raw, generation),
                               limits=layout.limits_of(key), where=f"{where}/{key}")


def check_generation(store: Storage, job: str, generation: int) -> None:
    """:raises StaleGeneration: `generation` is no longer the current one."""
    # Claims are contiguous (current + 1, created exclusively) and never deleted: a newer
    # generation exists iff generation + 1 does. One existence check, no listing (this
    # fence runs on every batch and before every effect).
    if store.exists(layout.generation_key(generation + 1)):
        current = newest_generation(store, generation + 1)
        raise StaleGeneration(
            f"generation {generation} of job {job!r} was superseded by generation {current}; "
            "this run must stop (another run of the job has started)"
        )
