"""Parallel checkpoint uploads, restore downloads and savepoint copies (issue 18): the
stored bytes are the live bytes, several transfers really run at once, and one failed
transfer fails the whole step with no ``_metadata`` written."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, open_snapshot, transfer
from airflow_sparkpoint.checkpoints import layout as ck_layout
from airflow_sparkpoint.exceptions import SparkpointError, StorageError
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.restore import materialize
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage, ObjectInfo
from tests.support.checkpointers import checkpointer
from tests.support.fake_sinks import RecordingSink

FILES = 24


class Gate:
    """The first `meet` transfers wait for each other (a barrier that breaks, failing the
    transfer, if they are not under way at the same time); `fail` names keys that fail."""

    def __init__(self, meet: int = 2, fail: str | None = None) -> None:
        self.barrier = threading.Barrier(meet, timeout=30)
        self.meet = meet
        self.fail = fail
        self.lock = threading.Lock()
        self.calls = 0
        self.running = 0
        self.after_failure = 0
        self.failed = False

    def enter(self, key: str) -> None:
        with self.lock:
            self.calls += 1
            first = self.calls <= self.meet
            self.running += 1
            if self.failed:
                self.after_failure += 1
        if first:
            self.barrier.wait()
        if self.fail is not None and self.fail in key:
            with self.lock:
                self.failed = True
                self.running -= 1
            raise StorageError(f"injected failure writing {key}")

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


class GatedMemory(MemoryStorage):
    def __init__(self, gate: Gate) -> None:
        super().__init__(uuid.uuid4().hex)
        self.gate = gate
        self.gets = 0

    def upload_file(self, local_path: str, key: str) -> None:
        self.gate.enter(key)
        try:
            super().upload_file(local_path, key)
        finally:
            self.gate.leave()

    def download_file(self, key: str, local_path: str) -> None:
        self.gate.enter(key)
        try:
            super().download_file(key, local_path)
        finally:
            self.gate.leave()

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.gets += 1
        return super().get(key, max_bytes)


def write_many(root: Path, batch: int = 0) -> dict[str, bytes]:
    """A live location with `FILES` state files of distinct random content."""
    files = {"metadata": b'{"id":"q"}', f"offsets/{batch}": b"o", f"commits/{batch}": b"c"}
    for part in range(FILES):
        files[f"state/0/{part}/{batch + 1}.changelog"] = os.urandom(20_000 + part)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_checkpoint_uploads_run_at_once_and_store_the_live_bytes(tmp_path):
    gate = Gate(meet=3)
    catalog = Catalog(GatedMemory(gate), "job")
    generation = catalog.claim_generation().generation
    live = write_many(tmp_path)
    meta = checkpointer(catalog, tmp_path, RecordingSink(), generation).checkpoint(0)
    assert meta is not None and meta.stats.files_copied == len(live)
    assert {f.path for f in meta.files} == set(live)
    for ref in meta.files:
        data = catalog.store.get(ref.key)
        assert data == live[ref.path]
        assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data)
    assert meta.stats.bytes_copied == sum(len(d) for d in live.values())


def test_one_failed_upload_fails_the_checkpoint_and_leaves_no_metadata(tmp_path):
    gate = Gate(meet=2, fail="7.changelog")
    store = GatedMemory(gate)
    catalog = Catalog(store, "job")
    generation = catalog.claim_generation().generation
    write_many(tmp_path, batch=6)
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    with pytest.raises(SparkpointError, match="injected failure"):
        coord.checkpoint(6)
    assert gate.failed  # the fault fired
    assert gate.running == 0  # no upload left running behind the failed checkpoint
    assert catalog.checkpoints() == [] and catalog.latest() is None
    assert not [i.key for i in store.list() if i.key.endswith(ck_layout.METADATA)]
    # The next attempt (the store works again) stores what is missing, the failed file
    # too; what the failed attempt stored is not uploaded again.
    gate.fail = None
    before = gate.calls
    meta = coord.checkpoint(6)
    assert meta is not None and 1 <= meta.stats.files_copied == gate.calls - before < len(meta.files)
    assert meta is not None and {f.path for f in meta.files} == {
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert all(catalog.store.get(f.key) == (tmp_path / f.path).read_bytes() for f in meta.files)


def test_checkpoints_keep_their_transfer_threads_until_the_run_closes(tmp_path, monkeypatch):
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    coord = checkpointer(catalog, tmp_path, RecordingSink(), catalog.claim_generation().generation)
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    for batch in range(4):
        write_many(tmp_path, batch=batch)
        meta = coord.checkpoint(batch)
        assert meta is not None and meta.stats.files_copied >= FILES  # each uploaded new files
    # The pool grows to its size once (a pool per checkpoint started and stopped up to
    # 8 threads every time: 32 here).
    assert 1 <= len(started) <= transfer.THREADS
    assert all(thread.name.startswith("sparkpoint-upload") for thread in started)
    monkeypatch.undo()
    coord.close()
    for thread in started:
        thread.join(timeout=10)
    assert not [thread.name for thread in started if thread.is_alive()]
    # A checkpoint after the run ended (a coordinator thread still at work when the run
    # is torn down) fails like an abandoned one and starts no threads again.
    write_many(tmp_path, batch=4)
    with pytest.raises(SparkpointError, match="the run is ending"):  # no failure tolerated here
        coord.checkpoint(4)
    assert coord._uploads is None


def test_materialize_downloads_at_once_into_the_same_bytes(tmp_path):
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    live = write_many(tmp_path / "live")
    checkpointer(catalog, tmp_path / "live", RecordingSink(), generation).checkpoint(0)
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    gate = Gate(meet=3)
    gated = GatedMemory(gate)
    for info in catalog.store.list():
        gated.put(info.key, catalog.store.get(info.key))
    # a checkpoint's files: the catalog's store
    handle = type(handle)(uri=handle.uri, metadata=handle.metadata, files_store=gated)
    index = materialize(handle, str(tmp_path / "restored"))
    assert set(index) == set(live)
    for rel, data in live.items():
        assert (tmp_path / "restored" / rel).read_bytes() == data


def test_a_failed_download_fails_the_restore(tmp_path):
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    write_many(tmp_path / "live")
    checkpointer(catalog, tmp_path / "live", RecordingSink(), generation).checkpoint(0)
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    gate = Gate(meet=2, fail="shared")
    gated = GatedMemory(gate)
    for info in catalog.store.list():
        gated.put(info.key, catalog.store.get(info.key))
    handle = type(handle)(uri=handle.uri, metadata=handle.metadata, files_store=gated)
    with pytest.raises(StorageError, match="injected failure"):
        materialize(handle, str(tmp_path / "restored"))
    assert gate.failed and gate.running == 0


class CountingLocal(LocalStorage):
    gets = 0

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        type(self).gets += 1
        return super().get(key, max_bytes)


def _local_checkpoint(tmp_path: Path) -> tuple[Catalog, dict[str, bytes]]:
    catalog = Catalog(CountingLocal(str(tmp_path / "origin")), "job")
    generation = catalog.claim_generation().generation
    live = write_many(tmp_path / "live")
    checkpointer(catalog, tmp_path / "live", RecordingSink(), generation).checkpoint(0)
    return catalog, live


def test_savepoint_into_another_store_is_streamed_not_read_whole(tmp_path):
    """Failed before this change: the copy read each source file whole with `get`."""
    source, live = _local_checkpoint(tmp_path)
    gate = Gate(meet=3)
    target_store = GatedMemory(gate)
    target = Catalog(target_store, "job")
    latest = source.handle(source.latest())  # type: ignore[arg-type]
    CountingLocal.gets = 0
    handle = target.create_savepoint(latest)
    assert CountingLocal.gets == 0  # streamed from the files; the uploads ran 3 at once (the gate)
    assert handle.metadata.total_bytes == sum(len(d) for d in live.values())
    for ref in handle.metadata.files:
        assert handle.files_store.get(ref.key) == live[ref.path]


def test_savepoint_from_a_memory_checkpoint_to_local_disk_holds_the_same_bytes(tmp_path):
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    live = write_many(tmp_path / "live")
    checkpointer(catalog, tmp_path / "live", RecordingSink(), generation).checkpoint(0)
    target = Catalog(LocalStorage(str(tmp_path / "sp")), "job")
    handle = target.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
    reopened = open_snapshot(handle.uri)
    assert reopened.metadata.total_bytes == sum(len(d) for d in live.values())
    for ref in reopened.metadata.files:
        assert reopened.files_store.get(ref.key) == live[ref.path]


def test_a_failed_savepoint_copy_writes_no_metadata(tmp_path):
    source, _live = _local_checkpoint(tmp_path)
    gate = Gate(meet=2, fail="changelog")
    target_store = GatedMemory(gate)
    target = Catalog(target_store, "job")
    with pytest.raises(StorageError, match="injected failure"):
        target.create_savepoint(source.handle(source.latest()))  # type: ignore[arg-type]
    assert gate.failed and gate.running == 0
    assert [e for e in target.list_savepoints() if e.metadata is not None] == []  # listed only as incomplete
    assert not [i.key for i in target_store.list() if i.key.endswith(ck_layout.METADATA)]



class ListingMeetsUploads(MemoryStorage):
    """Each upload waits (up to `WAIT_S`) for the checkpoint's listing of ``shared/`` to
    have started, and notes whether it had."""

    WAIT_S = 2.0

    def __init__(self) -> None:
        super().__init__(uuid.uuid4().hex)
        self.listing = threading.Event()
        self.uploads_that_met_it = 0
        self.uploads = 0

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if prefix.rstrip("/").endswith(ck_layout.SHARED):
            self.listing.set()
        return super().list(prefix)

    def upload_file(self, local_path: str, key: str) -> None:
        met = self.listing.wait(self.WAIT_S)
        self.uploads += 1
        self.uploads_that_met_it += met
        super().upload_file(local_path, key)


def test_the_listing_that_validates_a_checkpoint_runs_beside_its_uploads(tmp_path):
    """The listing of ``shared/`` (what takes longest on a store whose prefix has seen many
    deletions) no longer waits for the uploads; what the checkpoint uploaded itself, the
    listing may miss, and it is not copied a second time."""
    store = ListingMeetsUploads()
    catalog = Catalog(store, "job")
    coord = checkpointer(catalog, tmp_path, RecordingSink(), catalog.claim_generation().generation)
    live = write_many(tmp_path)

    meta = coord.checkpoint(0)

    assert meta is not None and store.uploads == meta.stats.files_copied == len(live)
    assert store.uploads_that_met_it == len(live), "the uploads ran before the listing started"
    assert all(catalog.store.get(f.key) == live[f.path] for f in meta.files)
    assert catalog.list_checkpoints()[0].valid


def test_a_run_closing_between_taking_the_pool_and_using_it_abandons_the_checkpoint(tmp_path, monkeypatch):
    """`close` may shut the pool down right after a checkpoint took it: the checkpoint ends
    as abandoned (the run is ending), not with the pool's RuntimeError."""
    from concurrent.futures import ThreadPoolExecutor

    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    coord = checkpointer(catalog, tmp_path, RecordingSink(), catalog.claim_generation().generation)
    closed = ThreadPoolExecutor(max_workers=1)
    closed.shutdown()
    monkeypatch.setattr(coord, "_upload_pool", lambda: closed)
    write_many(tmp_path)
    with pytest.raises(SparkpointError, match="the run is ending"):
        coord.checkpoint(0)
    assert catalog.latest() is None


def test_a_run_closing_after_the_listing_started_abandons_the_checkpoint_at_its_uploads(
    tmp_path, monkeypatch
):
    """`close` may shut the pool down after the checkpoint's listing started and before its
    uploads are handed to the pool: the checkpoint ends as abandoned there too, not with
    the pool's RuntimeError from inside `transfer_all`."""
    from concurrent.futures import ThreadPoolExecutor

    class ClosedAfterFirstSubmit(ThreadPoolExecutor):
        submits = 0

        def submit(self, fn, /, *args, **kwargs):
            ClosedAfterFirstSubmit.submits += 1
            future = super().submit(fn, *args, **kwargs)
            self.shutdown(wait=False)  # `close`, right after the listing was handed over
            return future

    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    coord = checkpointer(catalog, tmp_path, RecordingSink(), catalog.claim_generation().generation)
    pool = ClosedAfterFirstSubmit(max_workers=2)
    monkeypatch.setattr(coord, "_upload_pool", lambda: pool)
    write_many(tmp_path)
    with pytest.raises(SparkpointError, match="the run is ending"):
        coord.checkpoint(0)
    assert ClosedAfterFirstSubmit.submits == 2  # the listing, then the first upload, refused
    assert catalog.latest() is None


class FailsLast(MemoryStorage):
    """Downloads of `fail` fail once every other download has finished."""

    def __init__(self, fail: str, others: int) -> None:
        super().__init__(uuid.uuid4().hex)
        self.fail, self.others, self.done = fail, others, 0
        self.lock = threading.Lock()
        self.failed = False

    def download_file(self, key: str, local_path: str) -> None:
        if self.fail in key:
            deadline = time.monotonic() + 5
            while self.done < self.others and time.monotonic() < deadline:
                time.sleep(0.01)
            self.failed = True
            raise StorageError(f"injected failure of {key}")
        super().download_file(key, local_path)
        with self.lock:
            self.done += 1


def test_a_restore_that_fails_midway_leaves_no_commit_in_the_location(tmp_path):
    """A location a restore left half-filled (a crash, a failed download) must not look like
    one at the snapshot's batch (`restore._live_matches`: the last commit and the metadata
    file): commits are placed last (found by the simulation, 20261501:444: the next start
    resumed it in place and its state was missing)."""
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    live = write_many(tmp_path / "live")
    checkpointer(catalog, tmp_path / "live", RecordingSink(), generation).checkpoint(0)
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    failing = FailsLast("state/0/7/", others=len(live) - 1)
    for info in catalog.store.list():
        failing.put(info.key, catalog.store.get(info.key))
    handle = type(handle)(uri=handle.uri, metadata=handle.metadata, files_store=failing)
    with pytest.raises(StorageError, match="injected failure"):
        materialize(handle, str(tmp_path / "restored"))
    assert failing.failed, "the injected download failure fired"
    assert (tmp_path / "restored" / "metadata").exists()  # other files did land
    assert livedir.last_commit(str(tmp_path / "restored")) is None
