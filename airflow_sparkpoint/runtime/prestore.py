"""What the checkpointer knows of the live files (`IndexEntry`), and storing a restored
snapshot's files in the job's shared area ahead of its first checkpoint (`Prestore`, which
the checkpointer holds): while Spark runs its first batch, instead of in that checkpoint,
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
from airflow_sparkpoint.exceptions import CheckpointAbandoned, ObjectNotFound, SparkpointError
from airflow_sparkpoint.storage.base import Storage

log = logging.getLogger(__name__)

__all__ = ["CheckpointAbandoned", "IndexEntry", "Prestore"]


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
    """The background copy of a restored snapshot's files (`start`); the checkpointer
    waits for it before its first checkpoint (`wait`) and counts what it stored (`stored`)."""

    def __init__(self, catalog: Catalog, live_root: str) -> None:
        self.catalog = catalog
        self.live_root = live_root
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._index: dict[str, IndexEntry] = {}
        self._stored = [0, 0]  # files, bytes stored ahead of the next checkpoint

    @property
    def stored(self) -> tuple[int, int]:
        """Files and bytes stored since the last checkpoint (`reset_stored`)."""
        return self._stored[0], self._stored[1]

    def reset_stored(self) -> None:
        """A checkpoint completed: what was stored before it counts as its copy."""
        self._stored = [0, 0]

    def start(self, source: Storage, index: dict[str, IndexEntry]) -> None:
        """Start storing the restored snapshot's files that are not yet this job's shared
        files (`index` entries ``stored=False``, whose objects are in `source`: a savepoint,
        another job) in the background, while Spark runs its first batch, instead of in the
        first checkpoint (which waits for it and copies only what is left). A file already
        in the shared area (the job restores its own savepoint) is not copied again; within
        one filesystem or one S3 service the copy does not pass through this process
        (`Storage.copy_from`). Nothing refers to these files until a checkpoint does, so a
        failure or a kill leaves only unreferenced files for retention. Each file stored is
        marked stored in `index` (the checkpointer's own)."""
        todo = sorted((path, entry) for path, entry in index.items() if not entry.stored)
        if not todo or self._thread is not None:
            return
        self._index = index
        self._thread = threading.Thread(
            target=self._store_all, args=(source, todo), name="sparkpoint-prestore", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let the background copy start nothing new (the run is ending)."""
        self._stop.set()

    def _store_all(self, source: Storage, todo: list[tuple[str, IndexEntry]]) -> None:
        started = time.monotonic()

        def stopped() -> None:
            if self._stop.is_set():
                raise CheckpointAbandoned("the run is ending")

        try:
            present = {info.key: info.size for info in self.catalog.store.list(layout.SHARED)}
            transfer_all(lambda item: self._store_one(source, present, *item), todo, check=stopped)
        except (SparkpointError, OSError) as exc:
            log.warning("storing the restored files ahead of the first checkpoint stopped (it copies what is "
                        "left itself): %s", exc)
            return
        log.info("stored %d of the restored snapshot's %d files (%d bytes) in %s ahead "
                 "of the first checkpoint "
                 "in %.2f s", self._stored[0], len(todo), self._stored[1], self.catalog.uri,
                 time.monotonic() - started)

    def _store_one(self, source: Storage, present: Mapping[str, int], path: str, entry: IndexEntry) -> None:
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
            if self._index.get(path) is entry:
                self._index[path] = IndexEntry(entry.size, entry.mtime_ns, ref)
                if copied:
                    self._stored[0] += 1
                    self._stored[1] += copied

    def wait(self, batch_id: int, started: float, timeout_s: float) -> None:
        """Before the checkpoint of `batch_id` (begun at monotonic `started`): wait for the
        background copy to end.

        :raises CheckpointAbandoned: it did not end within the checkpoint's `timeout_s`.
        """
        thread = self._thread
        if thread is None:
            return
        thread.join(max(0.0, timeout_s - (time.monotonic() - started)))
        if thread.is_alive():
            raise CheckpointAbandoned(
                f"checkpoint of batch {batch_id} exceeded spark.sparkpoint.checkpoint.timeout={timeout_s:g}s "
                "waiting for the restored files to be stored"
            )
        self._thread = None
