"""The checkpointer: turns a run's confirmed micro-batches into retained checkpoints
(Flink's CheckpointCoordinator, without the commit: `runtime.committer`), and takes the
run's savepoints.

Runs in the driver, on the coordinator thread, so checkpoints and savepoints never
interleave. Knows nothing of Spark beyond the files of the live checkpoint location.

Before a checkpoint's ``_metadata`` is written, every shared file it references is checked
against one listing of ``shared/`` (taken beside the checkpoint's uploads, and shared with
retention) and against the deletion journal, and whatever is missing is copied again
from the live location: one file deleted under the job's feet must not make every later
checkpoint invalid. Shared files nobody references are only collected after the
checkpoint timeout (another generation may be uploading them for its checkpoint).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import (
    Catalog,
    FileRef,
    SnapshotHandle,
    SnapshotMetadata,
    SnapshotStats,
    layout,
    spark_layout,
    transfer,
)
from airflow_sparkpoint.checkpoints.counters import CheckpointPoint, CounterRecorder
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.retention import (
    JOURNAL_LOOKBACK_S,
    KnownRecords,
    deleted_since,
    enforce_checkpoint_retention,
)
from airflow_sparkpoint.checkpoints.transfer import transfer_all
from airflow_sparkpoint.exceptions import (
    CatalogError,
    ObjectExists,
    ObjectNotFound,
    SinkLineageError,
    SparkpointError,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.prestore import CheckpointAbandoned, IndexEntry, Prestore
from airflow_sparkpoint.storage import ObjectInfo
from airflow_sparkpoint.storage.base import Storage

log = logging.getLogger(__name__)

__all__ = ["MAX_CHECKPOINT_BACKLOG", "RELIST_AFTER_S", "Checkpointer"]

# checkpoint.interval=0: every committed batch is checkpointed while at most this many are
# due at once; beyond, only the newest. A backlog worked through while checkpoints stay
# slower than batches would delay output (commit.mode=checkpoint) and control requests
# without bound, and Spark deletes its oldest batches' files (minBatchesToRetain, 100).
MAX_CHECKPOINT_BACKLOG = 5
#: a checkpoint lists ``shared/`` beside its uploads; uploads that end later than this after
#: the listing began are followed by a second listing, so that a deletion nobody journals
#: (by hand, a lifecycle rule) goes unseen at most this much longer than with the
#: listing after the uploads
RELIST_AFTER_S = 1.0


class Checkpointer:
    """Takes incremental checkpoints of a local live location, and savepoints; what a
    checkpoint records of the run's transactions it asks `transactions` (the committer)."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        fence: Fence,
        live_root: str,
        transactions: Committer,
        interval_s: float,
        num_retained: int,
        timeout_s: float,
        tolerable_failures: int,
        spark_info: Mapping[str, Any] | None = None,
        on_status: Callable[[], None] | None = None,
    ) -> None:
        assert fence.generation is not None, "a run checkpoints as its own generation"
        self.catalog = catalog
        self.fence = fence
        self.generation: int = fence.generation
        self.live_root = live_root
        self.transactions = transactions
        self.interval_s = interval_s
        self.num_retained = num_retained
        self.timeout_s = timeout_s
        self.tolerable_failures = tolerable_failures
        self.spark_info = dict(spark_info or {})
        self._on_status = on_status
        self._lock = threading.Lock()
        self.index: dict[str, IndexEntry] = {}
        self.last_checkpoint: SnapshotMetadata | None = None
        self.last_checkpoint_at = 0.0
        self.confirmed_batch: int | None = None
        # The newest batch a checkpoint was tried for (or restored, or replayed): with interval 0 the
        # batches after it are due, the ones before it are done or their failure tolerated.
        self.last_attempted: int | None = None
        self.consecutive_failures = 0
        self.checkpoints_completed = 0
        # Lifetime counters for the history model (metrics only: never fails the job).
        self.counters = CounterRecorder(catalog, self.generation)
        self.prestore = Prestore(catalog, live_root)
        self.known = KnownRecords()  # so a checkpoint's requests do not grow with the job's age
        self._uploads: ThreadPoolExecutor | None = None  # the checkpoints' transfer threads, kept
        self._closed = False

    # ------------------------------------------------------------------ inputs

    def seed(self, snapshot: SnapshotMetadata | None, index: Mapping[str, IndexEntry]) -> None:
        """Start from a restored snapshot: reuse its stored files."""
        self.index = dict(index)
        self.last_checkpoint = snapshot if snapshot is not None and snapshot.kind == "checkpoint" else None
        if snapshot is not None:
            self.confirmed_batch = self.last_attempted = snapshot.batch_id
            self.counters.restored()

    def store_ahead(self, source: Storage) -> None:
        """Store the restored files not yet in the shared area while Spark runs its first
        batch (`Prestore.start`)."""
        self.prestore.start(source, self.index)

    def close(self) -> None:
        """The run has ended: stop the background copy and the checkpoints' transfer threads."""
        self.prestore.stop()
        with self._lock:
            self._closed = True
            uploads, self._uploads = self._uploads, None
        if uploads is not None:
            uploads.shutdown(wait=False)

    def _upload_pool(self) -> ThreadPoolExecutor:
        """The checkpoints' transfer threads, started once: a checkpoint every few seconds
        would otherwise start and stop them each time. The prestore has its own (it would
        hold a checkpoint's uploads behind its backlog).

        :raises CheckpointAbandoned: the run has ended (`close`).
        """
        with self._lock:
            if self._closed:
                raise CheckpointAbandoned("the run is ending")
            if self._uploads is None:
                self._uploads = ThreadPoolExecutor(max_workers=transfer.THREADS,
                                                   thread_name_prefix="sparkpoint-upload")
            return self._uploads

    def confirm(self, batch_id: int) -> None:
        with self._lock:
            if self.confirmed_batch is None or batch_id > self.confirmed_batch:
                self.confirmed_batch = batch_id

    # ------------------------------------------------------------------ checkpoints

    def due_batches(self, *, final: bool = False) -> list[int]:
        """The batches to checkpoint now, oldest first.

        ``checkpoint.interval`` 0 (every batch): each batch Spark committed (``commits/<id>``
        in the live location) after the newest one a checkpoint was tried for, up to the
        newest confirmed one, so progress events queued behind each other while a checkpoint
        ran, or not yet seen when the query ended, skip no batch; when more
        than `MAX_CHECKPOINT_BACKLOG` are due, only the newest (a warning names the rest). With an
        interval: the newest confirmed batch once the interval has passed (at the run's end,
        `final`, at once); the batches between get no checkpoint. The newest confirmed batch
        stays due while it has no completed checkpoint (its last try failed).
        """
        confirmed = self.confirmed_batch
        if confirmed is None:
            return []
        newest = ([confirmed] if self.last_checkpoint is None or self.last_checkpoint.batch_id < confirmed
                  else [])
        if self.interval_s > 0:
            return newest if final or time.monotonic() - self.last_checkpoint_at >= self.interval_s else []
        floor = -1 if self.last_attempted is None else self.last_attempted
        between = [b for b in livedir.committed_batches(self.live_root) if floor < b < confirmed]
        if len(between) + len(newest) > MAX_CHECKPOINT_BACKLOG:
            log.warning("checkpoints are slower than batches: %d batches are due, more "
                        "than %d; checkpointing only "
                        "batch %d, batches %d..%d get no checkpoint of their own", len(between) + len(newest),
                        MAX_CHECKPOINT_BACKLOG, confirmed, between[0], between[-1])
            return newest
        return between + newest

    def replayed(self, last: int) -> None:
        """The batches up to `last` were replayed (`runtime.replay`): the sink holds them and
        they get no checkpoint of their own; the next checkpoint covers them."""
        self.last_attempted = last if self.last_attempted is None else max(self.last_attempted, last)

    def checkpoint(self, batch_id: int) -> SnapshotMetadata | None:
        """Take a retained checkpoint of the restart point after `batch_id`.

        Failures are counted; more than `checkpoint.tolerableFailures` consecutive ones
        raise. A stale generation raises `StaleGeneration` at once (invariant 5), and a
        pending transaction aborted under the live run `SinkLineageError` (no retry
        brings its output back: `Committer.recorded_at`).
        """
        self.last_attempted = batch_id if self.last_attempted is None else max(self.last_attempted, batch_id)
        try:
            meta = self._checkpoint(batch_id)
        except (StaleGeneration, SinkLineageError):
            raise
        except (CatalogError, StorageError, OSError, CheckpointAbandoned) as exc:
            self.consecutive_failures += 1
            self.counters.failed()
            log.warning(
                "checkpoint of batch %d failed (%d consecutive, %d tolerable): %s",
                batch_id, self.consecutive_failures, self.tolerable_failures, exc,
            )
            if self.consecutive_failures > self.tolerable_failures:
                raise SparkpointError(
                    f"checkpoint of batch {batch_id} failed and {self.consecutive_failures} "
                    "consecutive failures "
                    f"exceed spark.sparkpoint.checkpoint.tolerableFailures={self.tolerable_failures}: {exc}"
                ) from exc
            return None
        self.consecutive_failures = 0
        return meta

    def _checkpoint(self, batch_id: int) -> SnapshotMetadata:
        started = time.monotonic()
        self.fence.check()
        self.prestore.wait(batch_id, started, self.timeout_s)
        files: list[FileRef] = []
        new: list[tuple[livedir.LiveFile, IndexEntry | None]] = []
        source_ends = livedir.source_log_ends(self.live_root, batch_id)
        walked = set()
        for live in livedir.walk(self.live_root):
            walked.add(live.path)
            if not livedir.needed_for_restart(live.path, batch_id, source_ends):
                continue
            known = self.index.get(live.path)
            unchanged = known is not None and known.size == live.size and known.mtime_ns == live.mtime_ns
            if unchanged and known.stored:  # type: ignore[union-attr]
                files.append(known.ref)  # type: ignore[union-attr]
            else:
                new.append((live, known if unchanged else None))
        # Spark deleted it (an index of every file ever written grows)
        for gone in self.index.keys() - walked:
            del self.index[gone]
        # The listing that validates the checkpoint (`_ensure_stored`) runs beside the
        # uploads: on a store whose prefix has seen many deletions it takes longest.
        pool = transfer.ClosingPool(self._upload_pool(), lambda: CheckpointAbandoned("the run is ending"))
        listed = pool.submit(self._list_stored)
        try:
            # Hash and upload the new files a few at a time (`transfer`): one failure fails
            # the checkpoint before anything below runs, so no _metadata refers to a missing
            # file (the files stored meanwhile stay indexed: a retry does not upload them again).
            uploaded = [ref for ref in transfer_all(
                lambda item: self._upload(item[0], batch_id,
                                          item[1].ref.sha256 if item[1] is not None else None, started),
                new, check=lambda: self._check_timeout(batch_id, started),
                on_half=lambda: faults.maybe_kill("copy", batch_id), hold_at_half=faults.armed("copy"),
                pool=pool,
            ) if ref is not None]
        finally:
            wait([listed])  # also after a failed upload: no listing outlives its checkpoint
        stored, fresh = listed.result(), {ref.key for ref in uploaded}
        if time.time() - stored[0] > RELIST_AFTER_S:
            stored, fresh = self._list_stored(), set()  # taken after the uploads: it shows them
        files.extend(uploaded)
        # What `prestore` copied for this checkpoint counts as its copy.
        prestored_files, prestored_bytes = self.prestore.stored
        copied = sum(ref.size for ref in uploaded) + prestored_bytes
        recopied, listing, journal = self._ensure_stored(files, batch_id, started, stored, uploaded=fresh)
        copied += recopied
        faults.maybe_kill("metadata", batch_id)
        recorded = self.transactions.recorded_at(batch_id)
        files.sort(key=lambda f: f.path)
        ids = self.catalog.checkpoint_ids()  # one listing for the new id and for retention
        meta = SnapshotMetadata(
            kind="checkpoint",
            id=self.catalog.next_checkpoint_id(ids, recent_savepoints=True),
            job=self.catalog.job,
            generation=self.generation,
            batch_id=batch_id,
            created_at=time.time(),
            files=tuple(files),
            live_root=self.live_root,
            transactions=recorded.transactions,
            sink_positions=recorded.sink_positions,
            batch_owners=recorded.batch_owners,
            stats=SnapshotStats(
                duration_ms=int((time.monotonic() - started) * 1000),
                bytes_copied=copied,
                files_copied=len(uploaded) + prestored_files,
                bytes_total=sum(f.size for f in files),
                file_count=len(files),
            ),
            spark=self.spark_info,
        )
        uri, meta = self._complete(meta)
        self.known.checkpoints[meta.id] = meta
        self.prestore.reset_stored()
        self.last_checkpoint = meta
        self.last_checkpoint_at = time.monotonic()
        self.checkpoints_completed += 1
        self.counters.completed(meta.created_at, CheckpointPoint(
            meta.id, batch_id, meta.created_at, meta.stats.duration_ms, meta.stats.bytes_copied,
            meta.stats.bytes_total))
        log.info(
            "checkpoint %d completed: batch %d, %d ms, %d of %d files copied (%d of %d bytes) -> %s",
            meta.id, batch_id, meta.stats.duration_ms, meta.stats.files_copied, meta.stats.file_count,
            meta.stats.bytes_copied, meta.stats.bytes_total, uri,
        )
        faults.pause("after_metadata", batch_id, generation=self.generation)
        try:
            retention = enforce_checkpoint_retention(
                self.catalog, self.num_retained, grace_seconds=self.timeout_s, generation=self.generation,
                shared_listing=listing,
                on_deleted=lambda done, total: faults.maybe_kill_halfway("retention", batch_id, done, total),
                before_delete=lambda: faults.pause("retention_delete", batch_id, generation=self.generation),
                known=self.known, journal_listing=journal, checkpoint_ids=[*ids, meta.id],
            )
        except StorageError as exc:
            # The checkpoint is complete: failing to collect garbage must not fail it (nor
            # the job); the next checkpoint's retention pass deletes what is left.
            log.warning("retention after checkpoint %d failed; older checkpoints and "
                        "unreferenced shared files "
                        "stay until the next pass: %s", meta.id, exc)
        else:
            if retention.deleted_checkpoints:
                log.info("retention removed checkpoints %s and %d shared files",
                         list(retention.deleted_checkpoints), retention.deleted_files)
        faults.maybe_kill("checkpointed", batch_id)
        if self._on_status:
            self._on_status()
        return meta

    def checkpoint_final_snapshot(
        self, *, min_deltas: int, timeout_s: float, min_replay: int, cancelled: Callable[[], bool],
    ) -> SnapshotMetadata | None:
        """At the job's end, when a restart from the last checkpoint would replay at least
        `min_replay` bytes of changelog: wait up to `timeout_s` for the RocksDB snapshots
        Spark created at its last commits (uploaded by its background maintenance, after the
        last checkpoint was taken), then checkpoint the last batch again if the live
        location holds a snapshot the last checkpoint lacks (also one uploaded before the
        end, with nothing left to wait for). Best effort: the last checkpoint is already
        complete, so a failure here is logged, never raised (a stale generation is).
        """
        last = self.last_checkpoint
        if last is None or timeout_s <= 0:
            return None
        batch = last.batch_id
        replay = livedir.replay_bytes((f.path, f.size) for f in last.files)
        if replay < min_replay:
            return None
        pending = livedir.pending_snapshots(self.live_root, batch, min_deltas)
        if pending:
            log.info("waiting up to %.0f s for Spark to upload the state snapshots of "
                     "%d stores (a restart from "
                     "checkpoint %d would replay %d bytes of changelog)", timeout_s, len(pending), last.id,
                     replay)
        started = time.monotonic()
        deadline = started + timeout_s
        while pending and not cancelled() and time.monotonic() < deadline:
            time.sleep(0.5)
            pending = livedir.pending_snapshots(self.live_root, batch, min_deltas, [s.dir for s in pending])
        if pending:
            log.warning("%d state stores still have no uploaded snapshot after %.1f s; restarts replay their "
                        "changelogs", len(pending), time.monotonic() - started)
        stored = livedir.newest_snapshots(f.path for f in last.files)
        fresh = [s for s in livedir.state_stores(self.live_root, batch) if s.snapshot > stored.get(s.dir, 0)]
        if not fresh or cancelled():
            return None
        try:  # not `checkpoint`: a failure here is no failed checkpoint of the job
            meta = self._checkpoint(batch)
        except StaleGeneration:
            raise
        except (CatalogError, StorageError, OSError, CheckpointAbandoned) as exc:
            log.warning("checkpoint of batch %d with the state snapshots failed; "
                        "checkpoint %d stays the latest: %s",
                        batch, last.id, exc)
            return None
        log.info("checkpoint %d holds the state snapshots of %d stores (batch %d): a "
                 "restart loads them instead "
                 "of replaying changelogs", meta.id, len(fresh), batch)
        return meta

    def _check_timeout(self, batch_id: int, started: float) -> None:
        if time.monotonic() - started > self.timeout_s:
            raise CheckpointAbandoned(
                f"checkpoint of batch {batch_id} exceeded "
                f"spark.sparkpoint.checkpoint.timeout={self.timeout_s:g}s"
            )

    def _upload(self, live: livedir.LiveFile, batch_id: int, sha: str | None,
                started: float) -> FileRef | None:
        """Copy one live file into the shared area (content-addressed) and index it. Runs
        in transfer threads; the caller's thread waits meanwhile and each call indexes its
        own path (one dict store: atomic).

        Spark's RocksDB maintenance writes a snapshot's SST files in place, before the
        ``.zip`` that references them: an SST that changes while it is copied is copied
        again until a copy saw no change, and one that vanished is left out (None; Spark
        deletes only SSTs no retained version references). Any other file is written
        once by Spark, so a change or a disappearance fails the checkpoint.

        :raises CatalogError: a file other than an SST changed or vanished.
        :raises CheckpointAbandoned: an SST was still being written at the timeout.
        """
        sst = spark_layout.is_rocksdb_sst(live.path)
        while True:
            try:
                sha = sha or livedir.file_sha256(live.abspath)
                key = self.catalog.shared_key(live.path, sha)
                self.catalog.store.upload_file(live.abspath, key)
                st = os.stat(live.abspath)
            except (FileNotFoundError, ObjectNotFound):
                if sst:
                    log.info("SST %s went while checkpointing batch %d (Spark's maintenance deleted it); "
                             "left out", live.path, batch_id)
                    return None
                # Spark's maintenance removed it between listing and copying: an old version.
                raise CatalogError(f"live file {live.path} vanished while "
                                   f"checkpointing batch {batch_id}") from None
            if st.st_size == live.size and st.st_mtime_ns == live.mtime_ns:
                break
            if not sst:
                raise CatalogError(f"live file {live.path} changed while checkpointing batch {batch_id}")
            log.info("SST %s is still being written (%d -> %d bytes); copying it again", live.path, live.size,
                     st.st_size)
            self._check_timeout(batch_id, started)
            time.sleep(0.2)
            live, sha = livedir.LiveFile(live.path, live.abspath, st.st_size, st.st_mtime_ns), None
        ref = FileRef(path=live.path, key=key, size=live.size, sha256=sha, mtime_ns=live.mtime_ns)
        self.index[live.path] = IndexEntry(live.size, live.mtime_ns, ref)
        return ref

    def _list_stored(self) -> tuple[float, list[Any]]:
        """When the listing of ``shared/`` began, and the listing."""
        listed_at = time.time()
        return listed_at, list(self.catalog.store.list(layout.SHARED))

    def _ensure_stored(self, files: list[FileRef], batch_id: int, started: float,
                       stored: tuple[float, list[Any]], *,
                       uploaded: set[str]) -> tuple[int, list[Any], list[Any]]:
        """Validate before completing: copy again every referenced shared file that is gone
        (deleted by hand, by a lifecycle rule, by another process's retention). `stored`
        is `_list_stored`'s answer; the keys this checkpoint `uploaded` may be missing from
        it (it ran beside their uploads). The deletion journal is listed now, after the
        uploads: another process's retention journals before it deletes, so every deletion
        since shortly before the listing of ``shared/`` that it may have missed is there.
        Returns the bytes copied again and the listings of ``shared/`` (with what was
        stored since) and of the journal (for retention)."""
        listed_at, listing = stored
        present = {info.key: info.size for info in listing}
        # Deletions journaled since shortly before the listing (clock skew between hosts).
        journal = list(self.catalog.store.list(layout.GC))
        gone = deleted_since(self.catalog, listed_at - JOURNAL_LOOKBACK_S, self.known, journal)
        missing = [ref for ref in files
                   if (ref.key not in uploaded and present.get(ref.key) != ref.size) or ref.key in gone]
        copied = 0
        for ref in missing:
            self._check_timeout(batch_id, started)
            path = os.path.join(self.live_root, *ref.path.split("/"))
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise CatalogError(f"shared file {ref.key} is missing and "
                                   f"live file {ref.path} is gone") from None
            live = livedir.LiveFile(ref.path, path, st.st_size, st.st_mtime_ns)
            if ((st.st_size, st.st_mtime_ns) != (ref.size, ref.mtime_ns)
                    and livedir.file_sha256(path) != ref.sha256):
                raise CatalogError(f"shared file {ref.key} is missing and live file {ref.path} changed")
            log.warning("shared file %s referenced by checkpoint of batch %d is missing "
                        "from %s; copying it again",
                        ref.key, batch_id, self.catalog.uri)
            if self._upload(live, batch_id, ref.sha256, started) is None:
                raise CatalogError(f"shared file {ref.key} is missing and live file {ref.path} is gone")
            copied += ref.size
        # Retention judges the new checkpoint by this listing: what was stored since counts
        # (appended: the later entry of a key wins, e.g. over a damaged copy stored again).
        stored_since = {ref.key for ref in missing} | uploaded
        now = time.time()
        listing = listing + [ObjectInfo(ref.key, ref.size, now) for ref in files if ref.key in stored_since]
        return copied, listing, journal

    def _complete(self, meta: SnapshotMetadata) -> tuple[str, SnapshotMetadata]:
        """Write ``_metadata``; if a zombie took the id meanwhile, take the next one."""
        for _ in range(5):
            try:
                uri = self.catalog.complete_checkpoint(meta)
            except ObjectExists:
                log.warning("checkpoint id %d was taken by another writer; using the next one", meta.id)
                meta = meta.with_(id=self.catalog.next_checkpoint_id())
                continue
            return uri, meta
        raise CatalogError(f"could not find a free checkpoint id for batch {meta.batch_id}")

    def savepoint(self) -> SnapshotHandle:
        """A savepoint from the last completed checkpoint (checkpointing first if behind)."""
        if self.confirmed_batch is not None and (
            self.last_checkpoint is None or self.last_checkpoint.batch_id < self.confirmed_batch
        ):
            meta = self.checkpoint(self.confirmed_batch)
            if meta is None:
                raise SparkpointError(f"could not checkpoint batch {self.confirmed_batch} for the savepoint")
        if self.last_checkpoint is None:
            raise SparkpointError(
                f"job {self.catalog.job!r} has no completed batch yet; a savepoint needs at least one"
            )
        self.fence.check()
        batch = self.last_checkpoint.batch_id
        return self.catalog.create_savepoint(
            self.catalog.handle(self.last_checkpoint), generation=self.generation,
            on_copied=lambda done, total: faults.maybe_kill_halfway("savepoint", batch, done, total),
        )
