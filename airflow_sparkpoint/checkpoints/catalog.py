"""The checkpoint catalog of one job: the public face over the stores of its records.

`Catalog` composes one store per concern, each the one reader and writer of its records:

=====================  ======================================================================
``snapshot_store``     checkpoints, savepoints, shared files, the id floor (invariant 1):
                       `checkpoints.snapshot_store.SnapshotStore`
``generation_store``   generation claims and the fence (invariant 5):
                       `checkpoints.generations.GenerationStore`, `Fence`
``transaction_log``    sink transaction records: `checkpoints.txn_records.TransactionLog`
``origin_store``       lineage origin records and their pins: `checkpoints.origins.OriginStore`
``lineage_view``       the read model of both: restorable checkpoints, ``restore=latest``
                       (invariant 9): `checkpoints.lineage_view.LineageView`
=====================  ======================================================================

Its methods delegate, one line each, so the callers that know a job by its catalog keep
one object; new code in the catalog and the sinks uses the stores.
Pure Python over a `Storage`: no Spark, no Airflow.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog_types import (  # re-exported: callers import them from here
    GenerationInfo,
    SnapshotEntry,
    SnapshotHandle,
)
from airflow_sparkpoint.checkpoints.generations import Fence, GenerationStore
from airflow_sparkpoint.checkpoints.lineage import Origin, RestartPoint
from airflow_sparkpoint.checkpoints.lineage_view import LineageView
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.origins import OriginStore
from airflow_sparkpoint.checkpoints.snapshot_open import (
    open_snapshot,  # re-exported: callers import it from here
)
from airflow_sparkpoint.checkpoints.snapshot_store import SnapshotStore
from airflow_sparkpoint.checkpoints.status import read_status, write_status
from airflow_sparkpoint.checkpoints.txn_records import TransactionLog
from airflow_sparkpoint.storage import Storage, open_storage

__all__ = ["Catalog", "GenerationInfo", "SnapshotEntry", "SnapshotHandle", "open_snapshot"]


class Catalog:
    """Everything Sparkpoint knows about one job under one storage root."""

    def __init__(self, storage: Storage, job: str) -> None:
        self.job = layout.validate_job_name(job)
        self.storage = storage
        self.store: Storage = layout.JobStore(storage, job)
        self.uri = self.store.uri
        self.generation_store = GenerationStore(self.store, self.job, self.uri)
        self.snapshot_store = SnapshotStore(self.store, self.job, self.uri, self.generation_store)
        self.transaction_log = TransactionLog(self.store, self.job, self.uri)
        self.origin_store = OriginStore(self.store, self.uri, self.snapshot_store.key_of)
        self.lineage_view = LineageView(self.snapshot_store, self.origin_store)

    @classmethod
    def open(cls, uri: str, job: str, **storage_options: Any) -> Catalog:
        """Open the catalog of `job` under the storage root `uri`."""
        return cls(open_storage(uri, **storage_options), job)

    # ------------------------------------------------------------------ snapshots (`SnapshotStore`)

    def checkpoint_ids(self) -> builtins.list[int]:
        """Ids of every ``chk-<id>`` directory, complete or not, ascending."""
        return self.snapshot_store.checkpoint_ids()

    def next_checkpoint_id(self, ids: Iterable[int] | None = None, *, recent_savepoints: bool = False) -> int:
        """One more than any id in use or ever disposed (`SnapshotStore.next_checkpoint_id`)."""
        return self.snapshot_store.next_checkpoint_id(ids, recent_savepoints=recent_savepoints)

    def checkpoint_entry(
        self, checkpoint_id: int, present: Mapping[str, int] | None = None,
        known: SnapshotMetadata | None = None
    ) -> SnapshotEntry:
        """Checkpoint `checkpoint_id` as listed, valid or with its error
        (`SnapshotStore.checkpoint_entry`)."""
        return self.snapshot_store.checkpoint_entry(checkpoint_id, present, known)

    def checkpoint_uri(self, checkpoint_id: int) -> str:
        return self.snapshot_store.checkpoint_uri(checkpoint_id)

    def shared_key(self, path: str, sha256: str) -> str:
        """Where a file of Spark's checkpoint location is stored (`SnapshotStore.shared_key`)."""
        return self.snapshot_store.shared_key(path, sha256)

    def complete_checkpoint(self, meta: SnapshotMetadata) -> str:
        """Write ``chk-<id>/_metadata`` last, fenced before and after (`SnapshotStore.complete_checkpoint`,
        which says what it raises)."""
        return self.snapshot_store.complete_checkpoint(meta)

    def list_savepoints(self, *, slim: bool = False) -> builtins.list[SnapshotEntry]:
        """Every savepoint directory, newest first (`SnapshotStore.list_savepoints`)."""
        return self.snapshot_store.list_savepoints(slim=slim)

    def savepoint_entry(self, name: str) -> SnapshotEntry | None:
        """The savepoint directory `name`, or None (`SnapshotStore.savepoint_entry`)."""
        return self.snapshot_store.savepoint_entry(name)

    def create_savepoint(
        self,
        source: SnapshotHandle,
        *,
        generation: int | None = None,
        on_copied: Callable[[int, int], None] | None = None,
        key: str | None = None,
    ) -> SnapshotHandle:
        """Copy a snapshot into a self-contained savepoint (`SnapshotStore.create_savepoint`)."""
        return self.snapshot_store.create_savepoint(source, generation=generation, on_copied=on_copied,
                                                    key=key)

    def dispose(self, uri: str) -> int:
        """Delete a savepoint or checkpoint of this job (`SnapshotStore.dispose`, which says what it
        raises)."""
        return self.snapshot_store.dispose(uri)

    def snapshot_key(self, uri: str, *, savepoint_only: bool = False) -> str:
        """The key of the snapshot directory `uri` names (`SnapshotStore.snapshot_key`)."""
        return self.snapshot_store.snapshot_key(uri, savepoint_only=savepoint_only)

    def key_of(self, uri: str) -> str:
        """The key, relative to the job root, of `uri` (`SnapshotStore.key_of`)."""
        return self.snapshot_store.key_of(uri)

    def snapshot(self, checkpoint_id: int) -> SnapshotHandle:
        """A handle on completed checkpoint `checkpoint_id` (`SnapshotStore.snapshot`)."""
        return self.snapshot_store.snapshot(checkpoint_id)

    def own_snapshot(self, uri: str) -> SnapshotHandle | None:
        """A handle on this job's snapshot `uri` names, or None (`SnapshotStore.own_snapshot`)."""
        return self.snapshot_store.own_snapshot(uri)

    def handle(self, meta: SnapshotMetadata) -> SnapshotHandle:
        return self.snapshot_store.handle(meta)

    # ------------------------------------------------------- lineages (`LineageView`, `OriginStore`)

    def list_checkpoints(self, *, slim: bool = False) -> builtins.list[SnapshotEntry]:
        """Every ``chk-*`` directory, newest first, marked superseded (`LineageView.list_checkpoints`)."""
        return self.lineage_view.list_checkpoints(slim=slim)

    def checkpoints(self) -> builtins.list[SnapshotMetadata]:
        """Valid, complete checkpoints, newest first (`LineageView.checkpoints`)."""
        return self.lineage_view.checkpoints()

    def latest(self) -> SnapshotMetadata | None:
        """The newest restorable checkpoint, or None (`LineageView.latest`)."""
        return self.lineage_view.latest()

    def restart_point(self) -> RestartPoint:
        """What ``restore=latest`` resumes from (`LineageView.restart_point`, which says what it raises)."""
        return self.lineage_view.restart_point()

    def write_origin(self, origin: Origin) -> None:
        """Record what generation `origin.generation` started from (`OriginStore.write`)."""
        self.origin_store.write(origin)

    def has_origin(self, generation: int) -> bool:
        """Whether `generation` recorded its origin (`OriginStore.has`)."""
        return self.origin_store.has(generation)

    def origins(self, known: dict[str, Origin] | None = None) -> builtins.list[Origin]:
        """Every origin record, by generation (`OriginStore.read`)."""
        return self.origin_store.read(known)

    def delete_origins(self, origins: Iterable[Origin], kept: Iterable[Origin] = ()) -> None:
        """Delete origin records and the pins nothing keeps (`OriginStore.delete`)."""
        self.origin_store.delete(origins, kept)

    # ------------------------------------------------------------------ generations (`GenerationStore`)

    def current_generation(self) -> int:
        """The newest claimed generation, 0 when none (`GenerationStore.current_generation`)."""
        return self.generation_store.current_generation()

    def generations(self) -> builtins.list[int]:
        """Every claimed generation, in order (`GenerationStore.claimed`)."""
        return self.generation_store.claimed()

    def claim_generation(self, details: Mapping[str, Any] | None = None) -> GenerationInfo:
        """Atomically claim generation ``current + 1`` (`GenerationStore.claim`, which says what it
        raises)."""
        return self.generation_store.claim(details)

    def claim_generation_after(self, generation: int,
                               details: Mapping[str, Any] | None = None) -> GenerationInfo | None:
        """Atomically claim exactly ``generation + 1``, None when it is taken
        (`GenerationStore.claim_after`, which says what it raises)."""
        return self.generation_store.claim_after(generation, details)

    def generation_claim(self, generation: int) -> GenerationInfo | None:
        """The claim of `generation`, or None (`GenerationStore.claim_of`, which says what it raises)."""
        return self.generation_store.claim_of(generation)

    def check_generation(self, generation: int) -> None:
        """:raises StaleGeneration: `generation` is no longer the current one (`Fence.check`, the
        one idiom every caller in the package holds; this method stays for callers outside it)."""
        Fence(self.generation_store, generation).check()

    # ------------------------------------------------------------------ transactions (`TransactionLog`)

    def put_transaction(self, record: TransactionRecord) -> None:
        """Record a staged transaction (`TransactionLog.put`, which says what it raises)."""
        self.transaction_log.put(record)

    def transactions(self) -> builtins.list[TransactionRecord]:
        """Every recorded (not yet settled) transaction of this job, in batch order
        (`TransactionLog.records`)."""
        return self.transaction_log.records()

    def iter_transactions(self) -> Iterator[TransactionRecord]:
        """The recorded transactions of this job, one at a time (`TransactionLog`: another
        job's, or an unreadable one, is skipped with a warning)."""
        return iter(self.transaction_log)

    def transaction_keys(self) -> set[tuple[int, int]]:
        """``(batch_id, generation)`` of every recorded transaction, from one listing
        (`TransactionLog.keys`)."""
        return self.transaction_log.keys()

    def delete_transactions(self, records: Iterable[TransactionRecord]) -> None:
        self.transaction_log.delete(records)

    # ------------------------------------------------------------------ status

    def write_status(self, status: Mapping[str, Any]) -> None:
        """Write the status record of ``status["generation"]`` (`status.write_status`)."""
        write_status(self.store, status)

    def read_status(self, generation: int | None = None) -> dict[str, Any] | None:
        """The status record (`generation`'s own, when given), or None (`status.read_status`)."""
        return read_status(self.store, self.uri, generation)
