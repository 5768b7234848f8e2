"""The generation claims of a job (``generations/<g>``) and the fence over them.

A claim is one object per start, created exclusively (racing starters get distinct
generations) and never deleted. `GenerationStore` is the one writer and reader of the
`GenerationInfo` record; `Fence` is the one check that a generation is still the current
one (invariant 5: only the current generation acts). `Catalog` composes the store.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.catalog_types import GenerationInfo
from airflow_sparkpoint.exceptions import (
    ObjectExists,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.storage import Storage

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.metadata import TransactionRecord

__all__ = ["Claims", "Fence", "GenerationStore", "newest_generation"]


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


class GenerationStore:
    """The generation claims of one job (`store`: its keys, at `uri`)."""

    def __init__(self, store: Storage, job: str, uri: str) -> None:
        self.store = store
        self.job = job
        self.uri = uri
        self._seen = 0  # the newest generation seen claimed (claims are never deleted)

    def current_generation(self) -> int:
        """The newest claimed generation (0 when the job never started), from the newest
        this store has seen (`newest_generation`)."""
        self._seen = newest_generation(self.store, self._seen)
        return self._seen

    def claimed(self) -> list[int]:
        """Every claimed generation, in order (one listing)."""
        numbers = (layout.generation_of(info.key) for info in self.store.list(layout.GENERATIONS))
        return sorted(g for g in numbers if g is not None)

    def claim(self, details: Mapping[str, Any] | None = None) -> GenerationInfo:
        """Atomically claim generation ``current + 1`` and record `details` with it.

        :raises StorageError: no generation could be claimed after 1000 attempts.
        :raises CatalogError: the claim would be over its limits (`layout.limits_of`): its
            details are too big; nothing is claimed.
        """
        newest = 0
        for _ in range(1000):
            newest = newest_generation(self.store, newest)
            info = self.claim_after(newest, details)
            if info is not None:
                return info
        raise StorageError(f"could not claim a generation for job {self.job!r} after 1000 attempts")

    def claim_after(self, generation: int, details: Mapping[str, Any] | None = None) -> GenerationInfo | None:
        """Atomically claim exactly generation ``generation + 1``; None when another claimed
        it first (a caller that decided from `generation` being the newest decides again).

        :raises CatalogError: the claim would be over its limits; nothing is claimed.
        """
        info = GenerationInfo(generation + 1, time.time(), socket.gethostname(), os.getpid(),
                              dict(details or {}))
        key = layout.generation_key(info.generation)
        body = json.dumps(info.to_json()).encode()
        bounded.check_writable(body, layout.limits_of(key), f"{self.uri}/{key}")
        try:
            self.store.put_if_absent(key, body)
        except ObjectExists:
            return None
        self._seen = max(self._seen, info.generation)
        return info

    def claim_of(self, generation: int) -> GenerationInfo | None:
        """The claim of `generation`, or None when it was never claimed.

        :raises CorruptMetadata: the claim is unreadable (`CorruptRecord`: not JSON, over its
            limits, wrong fields, another generation's).
        :raises StorageError: the store cannot be read.
        """
        key = layout.generation_key(generation)
        return bounded.read_record(self.store, key, lambda raw: GenerationInfo.from_json(raw, generation),
                                   limits=layout.limits_of(key), where=f"{self.uri}/{key}")


class Claims(Protocol):
    """What a `Fence` reads of a job: its keys, its name and its newest claimed generation
    (a `GenerationStore`, or the `Catalog` that composes one)."""

    @property
    def store(self) -> Storage: ...

    @property
    def job(self) -> str: ...

    def current_generation(self) -> int: ...


@dataclass(frozen=True)
class Fence:
    """The generation a caller acts as (None: unfenced, for a catalog-less caller): a
    driver as its own; the commit step and the rollback as the newest generation claimed
    when they started (`observed`). The one check of invariant 5 (`check`) and the one rule
    of which transaction records the caller may settle (`admits`)."""

    claims: Claims
    generation: int | None

    @classmethod
    def observed(cls, claims: Claims) -> Fence:
        """Act as the newest generation claimed now (read it before anything else)."""
        return cls(claims, claims.current_generation())

    def check(self) -> None:
        """:raises StaleGeneration: a generation newer than this fence's was claimed."""
        if self.generation is None:
            return
        # Claims are contiguous (current + 1, created exclusively) and never deleted: a
        # newer generation exists iff generation + 1 does. One existence check, no listing
        # (this fence runs on every batch and before every effect).
        store = self.claims.store
        if store.exists(layout.generation_key(self.generation + 1)):
            current = newest_generation(store, self.generation + 1)
            raise StaleGeneration(
                f"generation {self.generation} of job {self.claims.job!r} was superseded "
                f"by generation {current}; "
                "this run must stop (another run of the job has started)"
            )

    def admits(self, record: TransactionRecord) -> bool:
        """Whether `record` is this caller's to settle: not written by a newer generation."""
        return self.generation is None or record.generation <= self.generation
