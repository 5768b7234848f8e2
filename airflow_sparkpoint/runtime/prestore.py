"""What the coordinator knows of the live files (`IndexEntry`), and storing a restored
snapshot's files in the job's shared area ahead of its first checkpoint (`Prestore`, a
part of `Coordinator`): while Spark runs its first batch, instead of in that checkpoint,
which waits for it and copies only what is left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_sparkpoint.checkpoints import Catalog, FileRef, layout
from airflow_sparkpoint.checkpoints.transfer import transfer_all
from airflow_sparkpoint.exceptions import ObjectNotFound, SparkpointError
from airflow_sparkpoint.storage.base import Storage

log = logging.getLogger(__name__)


class CheckpointAbandoned(SparkpointError):
    """A checkpoint ran past `checkpoint.timeout` and was abandoned."""


@dataclass
class IndexEntry:
    """A live file already stored (``ref``), as long as its size and mtime are unchanged.

    ``stored=False``: the file was materialized from another store (a savepoint, another
    root): its content and sha256 are known but it is not in this job's shared area yet,
    so the next checkpoint uploads it without hashing it again (NO_CLAIM).
    """

    size: int
    mtime_ns: int
    ref: FileRef
    stored: bool = True


class Prestore:
    """The background copy of `prestore`; the rest of the coordinator's state it shares
    is set by `Coordinator.__init__`."""

    catalog: Catalog
    live_root: str
    timeout_s: float
    index: dict[str, IndexEntry]
    _lock: threading.Lock
    _prestore: threading.Thread | None
    _prestore_stop: threading.Event
    _prestored: list[int]  # files, bytes stored ahead of the next checkpoint

    def prestore(self, source: Storage) -> None:
        """Start storing the restored snapshot's files that are not yet this job's shared
        files (index entries ``stored=False``, whose objects are in `source`: a savepoint,
        another job) in the background, while Spark runs its first batch, instead of in the
        first checkpoint (which waits for it and copies only what is left). A file already
        in the shared area (the job restores its own savepoint) is not copied again; within
        one filesystem or one S3 service the copy does not pass through this process
        (`Storage.copy_from`). Nothing refers to these files until a checkpoint does, so a
        failure or a kill leaves only unreferenced files for retention."""
        todo = sorted((path, entry) for path, entry in self.index.items() if not entry.stored)
        if not todo or self._prestore is not None:
            return
        self._prestore = threading.Thread(
            target=self._prestore_all, args=(source, todo), name="sparkpoint-prestore", daemon=True)
        self._prestore.start()

    def stop_prestore(self) -> None:
        """Let the background copy of `prestore` start nothing new (the run is ending)."""
        self._prestore_stop.set()

    def _prestore_all(self, source: Storage, todo: list[tuple[str, IndexEntry]]) -> None:
        started = time.monotonic()

        def stopped() -> None:
            if self._prestore_stop.is_set():
                raise CheckpointAbandoned("the run is ending")

        try:
            present = {info.key: info.size for info in self.catalog.store.list(layout.SHARED)}
            transfer_all(lambda item: self._prestore_one(source, present, *item), todo, check=stopped)
        except (SparkpointError, OSError) as exc:
            log.warning("storing the restored files ahead of the first checkpoint stopped (it copies what is "
                        "left itself): %s", exc)
            return
        log.info("stored %d of the restored snapshot's %d files (%d bytes) in %s ahead of the first checkpoint "
                 "in %.2f s", self._prestored[0], len(todo), self._prestored[1], self.catalog.uri,
                 time.monotonic() - started)

    def _prestore_one(self, source: Storage, present: Mapping[str, int], path: str, entry: IndexEntry) -> None:
        """Store one restored file under its content-addressed key and mark it stored.
        Runs in transfer threads."""
        key = self.catalog.shared_key(path, entry.ref.sha256)
        copied = 0
        if present.get(key) != entry.size:
            try:
                if not self.catalog.store.copy_from(source, entry.ref.key, key):
                    local = os.path.join(self.live_root, *path.split("/"))
                    self.catalog.store.upload_file(local, key)
                    st = os.stat(local)
                    if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
                        return  # rewritten meanwhile: the checkpoint decides what it needs
            except (ObjectNotFound, FileNotFoundError):
                return  # removed by Spark's maintenance meanwhile (or from the source): not needed
            copied = entry.size
        ref = FileRef(path=path, key=key, size=entry.size, sha256=entry.ref.sha256, mtime_ns=entry.mtime_ns)
        with self._lock:
            if self.index.get(path) is entry:
                self.index[path] = IndexEntry(entry.size, entry.mtime_ns, ref)
                if copied:
                    self._prestored[0] += 1
                    self._prestored[1] += copied

    def _await_prestore(self, batch_id: int, started: float) -> None:
        thread = self._prestore
        if thread is None:
            return
        thread.join(max(0.0, self.timeout_s - (time.monotonic() - started)))
        if thread.is_alive():
            raise CheckpointAbandoned(
                f"checkpoint of batch {batch_id} exceeded spark.sparkpoint.checkpoint.timeout={self.timeout_s:g}s "
                "waiting for the restored files to be stored"
            )
        self._prestore = None
