"""Restored files stored ahead of the first checkpoint (issue 18): after a restore from a
savepoint (or another job), the coordinator copies the snapshot's files into the job's
shared area in the background while Spark runs its first batch; the first checkpoint then
uploads nothing of them, counts what was copied for it, and stays complete when that copy
failed, was stopped, or a copied file was deleted before the checkpoint."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.catalog import open_snapshot
from airflow_sparkpoint.exceptions import StorageError
from airflow_sparkpoint.runtime.checkpointer import Checkpointer
from airflow_sparkpoint.runtime.restore import materialize
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage
from tests.support.checkpointers import checkpointer
from tests.support.fake_sinks import RecordingSink
from tests.support.live_dirs import write_live


def _savepoint(catalog: Catalog, live: Path, batches: int = 3) -> SnapshotHandle:
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, live, RecordingSink(), generation)
    for batch in range(batches):
        write_live(live, batch)
        assert coord.checkpoint(batch) is not None
    return catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]


def _restored(target: Catalog, savepoint: SnapshotHandle, live: Path) -> Checkpointer:
    index = materialize(savepoint, str(live), stored=False)
    assert index and not any(entry.stored for entry in index.values())
    coord = checkpointer(target, live, RecordingSink(), target.claim_generation().generation)
    coord.seed(savepoint.metadata, index)
    coord.transactions.seed(savepoint.metadata)
    return coord


def _count_uploads(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    uploads: list[str] = []
    real = store.upload_file
    monkeypatch.setattr(store, "upload_file", lambda path, key: uploads.append(key) or real(path, key))
    return uploads


def _assert_complete(catalog: Catalog, meta: Any, live: Path) -> None:
    for ref in meta.files:
        assert catalog.store.get(ref.key) == (live / ref.path).read_bytes(), ref.path


def test_a_savepoint_on_the_same_disk_is_hard_linked_before_the_first_checkpoint(tmp_path, monkeypatch):
    source = Catalog(LocalStorage(str(tmp_path / "root")), "blue")
    savepoint = _savepoint(source, tmp_path / "blue-live")
    savepoint = open_snapshot(savepoint.uri)  # as a restore opens it: its own store
    target = Catalog(LocalStorage(str(tmp_path / "root")), "green")
    live = tmp_path / "green-live"
    coord = _restored(target, savepoint, live)
    uploads = _count_uploads(target.store, monkeypatch)

    coord.store_ahead(savepoint.files_store)
    first = coord.checkpoint(2)

    assert first is not None and uploads == []  # nothing passed through the driver
    assert first.stats.files_copied == first.stats.file_count == len(savepoint.metadata.files)
    assert first.stats.bytes_copied == first.stats.bytes_total
    by_path = {ref.path: ref for ref in savepoint.metadata.files}
    for ref in first.files:
        stored = tmp_path / "root" / "green" / ref.key
        original = (tmp_path / "root" / "blue" / "savepoints" / savepoint.uri.rsplit("/", 1)[-1]
                    / by_path[ref.path].key)
        assert stored.stat().st_ino == original.stat().st_ino, ref.path
        assert ref.sha256 == by_path[ref.path].sha256 and ref.key == target.shared_key(ref.path, ref.sha256)
    _assert_complete(target, first, live)
    # From then on the files are the job's own: the next checkpoint copies only what changed,
    # and the counts of the restore's copy are not carried into it.
    write_live(live, 3)
    second = coord.checkpoint(3)
    assert second is not None and second.stats.files_copied == 3 and len(uploads) == 3


def test_restoring_the_jobs_own_savepoint_copies_nothing_that_is_stored(tmp_path, monkeypatch):
    """Blue-green on one job: the savepoint's files are still the job's shared files, so
    the first checkpoint after the restore copies nothing at all (it copied all before)."""
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    savepoint = _savepoint(catalog, tmp_path / "blue-live")
    live = tmp_path / "green-live"
    coord = _restored(catalog, savepoint, live)
    uploads = _count_uploads(catalog.store, monkeypatch)

    coord.store_ahead(savepoint.files_store)
    first = coord.checkpoint(2)

    assert first is not None and uploads == []
    assert (first.stats.files_copied, first.stats.bytes_copied) == (0, 0)
    _assert_complete(catalog, first, live)


class FailingUploads(MemoryStorage):
    """Uploads fail from the `fail_from`-th on while `failing` is set; counts them."""

    def __init__(self, fail_from: int) -> None:
        super().__init__(uuid.uuid4().hex)
        self.fail_from = fail_from
        self.failing = True
        self.calls = 0
        self.failed = 0
        self.lock = threading.Lock()

    def upload_file(self, local_path: str, key: str) -> None:
        with self.lock:
            self.calls += 1
            fail = self.failing and self.calls >= self.fail_from
            self.failed += fail
        if fail:
            raise StorageError(f"injected failure uploading {key}")
        super().upload_file(local_path, key)


def test_a_failed_copy_ahead_leaves_the_rest_to_the_first_checkpoint(tmp_path):
    source = Catalog(MemoryStorage(uuid.uuid4().hex), "blue")
    savepoint = _savepoint(source, tmp_path / "blue-live")
    store = FailingUploads(fail_from=3)
    target = Catalog(store, "green")
    live = tmp_path / "green-live"
    coord = _restored(target, savepoint, live)

    coord.store_ahead(savepoint.files_store)  # memory to memory: uploads from the live files
    coord.prestore._thread.join(30)  # type: ignore[union-attr]
    assert store.failed >= 1, "the injected failure did not happen"
    stored_ahead = sum(1 for entry in coord.index.values() if entry.stored)
    assert 1 <= stored_ahead < len(savepoint.metadata.files)
    store.failing = False
    first = coord.checkpoint(2)

    assert first is not None
    assert first.stats.files_copied == first.stats.file_count == len(savepoint.metadata.files)
    _assert_complete(target, first, live)


def test_a_file_copied_ahead_and_deleted_before_the_checkpoint_is_copied_again(tmp_path):
    """A copied-ahead file is referenced by nothing until the checkpoint: retention may
    take it (a hard link keeps the savepoint's old mtime); the checkpoint notices."""
    source = Catalog(MemoryStorage(uuid.uuid4().hex), "blue")
    savepoint = _savepoint(source, tmp_path / "blue-live")
    target = Catalog(MemoryStorage(uuid.uuid4().hex), "green")
    live = tmp_path / "green-live"
    coord = _restored(target, savepoint, live)
    coord.store_ahead(savepoint.files_store)
    coord.prestore._thread.join(30)  # type: ignore[union-attr]
    victim = next(entry.ref.key for entry in coord.index.values() if entry.stored)
    target.store.delete([victim])

    first = coord.checkpoint(2)

    assert first is not None and victim in {ref.key for ref in first.files}
    _assert_complete(target, first, live)


def test_a_stopped_copy_ahead_starts_nothing_and_the_checkpoint_copies_all(tmp_path, monkeypatch):
    source = Catalog(MemoryStorage(uuid.uuid4().hex), "blue")
    savepoint = _savepoint(source, tmp_path / "blue-live")
    target = Catalog(MemoryStorage(uuid.uuid4().hex), "green")
    live = tmp_path / "green-live"
    coord = _restored(target, savepoint, live)
    uploads = _count_uploads(target.store, monkeypatch)

    coord.prestore.stop()
    coord.store_ahead(savepoint.files_store)
    coord.prestore._thread.join(30)  # type: ignore[union-attr]
    assert uploads == [] and not any(entry.stored for entry in coord.index.values())
    first = coord.checkpoint(2)

    assert first is not None and len(uploads) == first.stats.files_copied == first.stats.file_count
    _assert_complete(target, first, live)


@pytest.mark.s3
def test_the_first_checkpoint_after_a_restore_on_s3_copies_server_side(tmp_path, s3_server, s3_bucket):
    """Issue 32: restoring a savepoint of the same S3 service stores its files in the job's
    shared area with CopyObject (the request log has no PutObject of them) and the bytes
    stay exact; the first checkpoint then uploads none of them."""
    from airflow_sparkpoint.storage import open_storage

    options = {"endpoint_url": s3_server, "region_name": "us-east-1"}
    root = f"s3://{s3_bucket}/root"
    savepoint = _savepoint(Catalog(open_storage(root, **options), "blue"), tmp_path / "blue-live")
    savepoint = open_snapshot(savepoint.uri, storage_options=options)  # as a restore opens it
    store = open_storage(root, **options)
    target = Catalog(store, "green")
    live = tmp_path / "green-live"
    coord = _restored(target, savepoint, live)
    requests: list[tuple[str, str]] = []
    store.client.meta.events.register(  # type: ignore[attr-defined]
        "before-parameter-build.s3",
        lambda model, params, **_: requests.append((model.name, str(params.get("Key", "")))))

    coord.store_ahead(savepoint.files_store)
    first = coord.checkpoint(2)

    assert first is not None
    shared = {ref.key for ref in first.files}
    assert len(shared) == len(savepoint.metadata.files)
    copied = {key.split("/green/", 1)[1] for op, key in requests if op == "CopyObject"}
    written = {key.split("/green/", 1)[1] for op, key in requests
               if op in ("PutObject", "CreateMultipartUpload", "UploadPart") and "/green/shared/" in key}
    assert copied == shared, requests
    assert written == set(), requests
    assert (first.stats.files_copied, first.stats.bytes_copied) == (len(shared), first.stats.bytes_total)
    _assert_complete(target, first, live)
