"""The catalog over memory, local disk and S3: completion, corruption, retention with
shared files, savepoints, disposal, generations, transaction records, status."""

from __future__ import annotations

import json
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog, open_snapshot
from airflow_sparkpoint.checkpoints.metadata import (
    FileRef,
    SnapshotMetadata,
    canonical_json,
    sha256_hex,
)
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.exceptions import (
    ConfigError,
    InvalidPath,
    ObjectExists,
    RestoreError,
    StaleGeneration,
)
from airflow_sparkpoint.storage import MemoryStorage, open_storage
from tests.support.records import snapshot_metadata, transaction_record

MakeCheckpoint = Callable[..., SnapshotMetadata]


def state(version: int, keys: int = 4) -> dict[str, bytes]:
    """A Spark-like checkpoint location at `version`: offsets/commits change every batch,
    state files change for one key at a time (so most files are shared)."""
    files = {f"offsets/{version}": f"offsets {version}".encode(), f"commits/{version}": b"{}"}
    for k in range(keys):
        changed_at = max(version - (version - k) % keys, 0)  # the last version that changed key k
        files[f"state/0/{k}/{changed_at}.delta"] = f"key {k} at {changed_at}".encode()
    return files


def referenced_keys_exist(catalog: Catalog, metas: list[SnapshotMetadata]) -> None:
    present = {info.key for info in catalog.store.list("")}
    for meta in metas:
        missing = [ref.key for ref in meta.files if ref.key not in present]
        assert not missing, f"checkpoint {meta.id} lost {missing}"


# --------------------------------------------------------------------------- basics


def test_empty_catalog(catalog: Catalog) -> None:
    assert catalog.latest() is None
    assert catalog.list_checkpoints() == [] and catalog.list_savepoints() == []
    assert catalog.checkpoints() == []
    assert catalog.next_checkpoint_id() == 1
    assert catalog.current_generation() == 0
    assert catalog.read_status() is None


def test_complete_and_list_newest_first(catalog: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    metas = [make_checkpoint(catalog, state(v)) for v in range(3)]
    assert [m.id for m in metas] == [1, 2, 3]
    assert [e.id for e in catalog.list_checkpoints()] == [3, 2, 1]
    assert all(e.valid and e.error is None for e in catalog.list_checkpoints())
    assert catalog.latest() == metas[-1]
    assert catalog.checkpoints() == metas[::-1]
    assert catalog.checkpoint_uri(3) == f"{catalog.uri}/chk-3"
    handle = catalog.snapshot(2)
    assert handle.metadata == metas[1] and handle.uri == f"{catalog.uri}/chk-2"
    with pytest.raises(ObjectExists):
        catalog.complete_checkpoint(metas[-1])


def test_shared_files_are_stored_once(catalog: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    first = make_checkpoint(catalog, state(4))
    second = make_checkpoint(catalog, state(5))
    shared = {ref.key for ref in first.files} & {ref.key for ref in second.files}
    assert len(shared) == 3  # 3 of 4 state files unchanged
    assert all(key.startswith("shared/") for key in shared)


# --------------------------------------------------------------------------- corruption matrix


def _rewrite(catalog: Catalog, meta: SnapshotMetadata, **changes: Any) -> None:
    body = {k: v for k, v in meta.to_json().items() if k != "checksum"}
    body.update(changes)
    body["checksum"] = "sha256:" + sha256_hex(canonical_json(body))
    catalog.store.put(layout.checkpoint_metadata(meta.id), json.dumps(body).encode())


def _truncated(catalog: Catalog, meta: SnapshotMetadata) -> str:
    catalog.store.put(layout.checkpoint_metadata(meta.id), meta.to_bytes()[:100])
    return "not valid JSON"


def _garbled(catalog: Catalog, meta: SnapshotMetadata) -> str:
    catalog.store.put(layout.checkpoint_metadata(meta.id), b"\x89PNG\r\n\x1a\n" + meta.to_bytes()[8:])
    return "not valid JSON"


def _wrong_checksum(catalog: Catalog, meta: SnapshotMetadata) -> str:
    body = meta.to_json()
    body["batch_id"] = 999  # content changed after signing
    catalog.store.put(layout.checkpoint_metadata(meta.id), json.dumps(body).encode())
    return "checksum mismatch"


def _missing_file(catalog: Catalog, meta: SnapshotMetadata) -> str:
    ref = next(r for r in meta.files if r.path.startswith("offsets/"))
    catalog.store.delete([ref.key])
    return f"referenced file {ref.key} is missing"


def _wrong_size(catalog: Catalog, meta: SnapshotMetadata) -> str:
    ref = next(r for r in meta.files if r.path.startswith("offsets/"))
    catalog.store.put(ref.key, b"x")
    return f"referenced file {ref.key} has 1 bytes, expected {ref.size}"


def _wrong_job(catalog: Catalog, meta: SnapshotMetadata) -> str:
    _rewrite(catalog, meta, job="payments")
    return "belongs to job 'payments', not 'orders'"


def _future_schema(catalog: Catalog, meta: SnapshotMetadata) -> str:
    _rewrite(catalog, meta, schema_version=7)
    return "schema_version 7 is not supported"


def _copied_from_elsewhere(catalog: Catalog, meta: SnapshotMetadata) -> str:
    _rewrite(catalog, meta, id=1)
    return "describes checkpoint 1, not 3"


CORRUPTIONS = [_truncated, _garbled, _wrong_checksum, _missing_file, _wrong_size, _wrong_job, _future_schema,
               _copied_from_elsewhere]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_corrupt_checkpoint_is_listed_invalid_and_skipped(
    catalog: Catalog, make_checkpoint: MakeCheckpoint, corrupt: Callable[[Catalog, SnapshotMetadata], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    catalog.claim_generation()
    make_checkpoint(catalog, state(0))
    previous = make_checkpoint(catalog, state(1))
    newest = make_checkpoint(catalog, state(2))
    reason = corrupt(catalog, newest)

    entry = catalog.list_checkpoints()[0]
    assert (entry.id, entry.valid) == (newest.id, False)
    assert entry.uri == f"{catalog.uri}/chk-{newest.id}"
    assert entry.error is not None and reason in entry.error and entry.uri in entry.error

    with caplog.at_level(logging.WARNING, logger="airflow_sparkpoint.checkpoints.catalog"):
        assert catalog.latest() == previous
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"{catalog.uri}/chk-{newest.id}" in warning and "falling back" in warning
    assert [m.id for m in catalog.checkpoints()] == [previous.id, previous.id - 1]
    with pytest.raises(RestoreError, match=f"chk-{newest.id} is not usable"):
        catalog.snapshot(newest.id)


def test_incomplete_checkpoint_is_never_returned(catalog: Catalog, make_checkpoint: MakeCheckpoint,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    catalog.claim_generation()
    done = make_checkpoint(catalog, state(0))
    catalog.store.put("chk-2/offsets/1", b"half written")  # a checkpoint that died before _metadata
    with caplog.at_level(logging.WARNING):
        assert catalog.latest() == done
        assert catalog.checkpoints() == [done]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # in progress is not an error
    entry = catalog.list_checkpoints()[0]
    assert (entry.id, entry.valid) == (2, False) and "no _metadata" in (entry.error or "")
    assert catalog.next_checkpoint_id() == 3


def test_only_incomplete_checkpoints_means_none(catalog: Catalog) -> None:
    catalog.store.put("chk-1/x", b"1")
    assert catalog.latest() is None


def test_files_outside_shared_are_checked_too(catalog: Catalog) -> None:
    catalog.claim_generation()
    catalog.store.put("chk-1/files/metadata", b"{}")
    meta = snapshot_metadata(0, job="orders", created_at=time.time(),
                             files=(FileRef("metadata", "chk-1/files/metadata", 2, sha256_hex(b"{}")),))
    catalog.complete_checkpoint(meta)
    assert catalog.latest() == meta
    catalog.store.delete(["chk-1/files/metadata"])
    assert catalog.latest() is None
    assert "chk-1/files/metadata is missing" in (catalog.list_checkpoints()[0].error or "")


# --------------------------------------------------------------------------- retention


def test_retention_keeps_num_retained_and_every_referenced_file(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    catalog.claim_generation()
    written: list[SnapshotMetadata] = []
    for version in range(12):
        written.append(make_checkpoint(catalog, state(version)))
        result = enforce_checkpoint_retention(catalog, 3)
        retained = catalog.checkpoints()
        assert [m.id for m in retained] == [m.id for m in written[-3:]][::-1]
        referenced_keys_exist(catalog, retained)
        referenced = {ref.key for m in retained for ref in m.files}
        on_disk = {info.key for info in catalog.store.list("shared")}
        assert on_disk == referenced, "orphans must be collected"
        if version >= 3:
            assert result.deleted_checkpoints == (written[-4].id,)
    assert catalog.latest() == written[-1]


def test_retention_collects_orphans_and_respects_grace(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, state(0))
    catalog.store.put("shared/state/9/orphan.zip~0000000000000000", b"12345")
    kept = enforce_checkpoint_retention(catalog, 1, grace_seconds=3600)
    assert kept.deleted_files == 0
    assert catalog.store.exists("shared/state/9/orphan.zip~0000000000000000")
    gone = enforce_checkpoint_retention(catalog, 1)
    assert (gone.deleted_files, gone.deleted_bytes) == (1, 5)
    assert not catalog.store.exists("shared/state/9/orphan.zip~0000000000000000")
    referenced_keys_exist(catalog, [meta])


def test_retention_without_any_valid_checkpoint_deletes_nothing(catalog: Catalog) -> None:
    catalog.store.put("shared/a~0000000000000000", b"1")
    catalog.store.put("chk-1/partial", b"1")
    assert enforce_checkpoint_retention(catalog, 1).deleted_files == 0
    assert catalog.store.exists("shared/a~0000000000000000") and catalog.store.exists("chk-1/partial")


def test_retention_removes_old_invalid_and_incomplete_dirs_but_not_newer_ones(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    catalog.claim_generation()
    catalog.store.put("chk-1/partial", b"1")  # died before _metadata, long ago
    make_checkpoint(catalog, state(0))  # chk-2
    make_checkpoint(catalog, state(1))  # chk-3
    catalog.store.put("chk-4/in-progress", b"1")
    result = enforce_checkpoint_retention(catalog, 1)
    assert set(result.deleted_checkpoints) == {1, 2}
    assert catalog.checkpoint_ids() == [3, 4]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_retention_validates_num_retained(catalog: Catalog, bad: Any) -> None:
    with pytest.raises(ConfigError, match=f"numRetained={bad!r} is invalid"):
        enforce_checkpoint_retention(catalog, bad)


# --------------------------------------------------------------------------- savepoints


def test_savepoint_is_self_contained(root: Any, catalog: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    for version in range(3):
        make_checkpoint(catalog, state(version))
    latest = catalog.latest()
    assert latest is not None
    handle = catalog.create_savepoint(catalog.handle(latest))
    assert handle.metadata.kind == "savepoint" and handle.metadata.source_checkpoint == latest.id
    assert handle.uri.startswith(f"{catalog.uri}/savepoints/savepoint-{latest.id}-")

    # Retention never touches savepoints, nor does disposing of every checkpoint.
    make_checkpoint(catalog, state(3))
    enforce_checkpoint_retention(catalog, 1)
    for checkpoint_id in catalog.checkpoint_ids():
        catalog.dispose(f"chk-{checkpoint_id}")
    catalog.store.delete_prefix("shared")
    assert not list(catalog.store.list("shared")) and catalog.checkpoint_ids() == []

    opened = open_snapshot(handle.uri, storage_options=root.options)
    assert opened.metadata == handle.metadata
    expected = {f.path: f.sha256 for f in latest.files}
    assert {f.path: sha256_hex(opened.files_store.get(f.key)) for f in opened.metadata.files} == expected
    [entry] = catalog.list_savepoints()
    assert entry.valid and entry.uri == handle.uri


def test_savepoint_of_a_savepoint_and_history_listing(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, state(0))
    first = catalog.create_savepoint(catalog.handle(meta))
    second = catalog.create_savepoint(first, generation=5)
    assert second.metadata.generation == 5 and second.metadata.source_checkpoint == meta.id
    assert second.metadata.id > first.metadata.id
    assert [e.uri for e in catalog.list_savepoints()] == [second.uri, first.uri]
    for ref in second.metadata.files:
        assert second.files_store.get(ref.key) == first.files_store.get(ref.key)


def test_open_snapshot_of_a_checkpoint_and_bad_targets(root: Any, catalog: Catalog,
                                                       make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, state(0))
    handle = open_snapshot(catalog.checkpoint_uri(meta.id), storage_options=root.options)
    assert handle.metadata == meta
    assert handle.files_store.get(meta.files[0].key)
    with pytest.raises(RestoreError, match="has no _metadata; expected a savepoint or checkpoint directory"):
        open_snapshot(f"{catalog.uri}/chk-99", storage_options=root.options)
    catalog.store.delete([meta.files[0].key])
    with pytest.raises(RestoreError, match=f"file {meta.files[0].key} is missing"):
        open_snapshot(catalog.checkpoint_uri(meta.id), storage_options=root.options)
    catalog.store.put(layout.checkpoint_metadata(meta.id) + "x", b"")  # unrelated
    catalog.store.put(layout.checkpoint_metadata(meta.id), b"{not json")
    with pytest.raises(RestoreError, match="restore target is corrupt: .*chk-1/_metadata: not valid JSON"):
        open_snapshot(catalog.checkpoint_uri(meta.id), storage_options=root.options)
    # over its size limit: corrupt (planted or garbled), as a listing and `verify` call it
    catalog.store.put(layout.checkpoint_metadata(meta.id), b" " * (layout.max_bytes_of(layout.METADATA) + 1))
    with pytest.raises(RestoreError, match="restore target is corrupt: .*chk-1/_metadata"):
        open_snapshot(catalog.checkpoint_uri(meta.id), storage_options=root.options)


def test_dispose_savepoint(catalog: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, state(0))
    handle = catalog.create_savepoint(catalog.handle(meta))
    assert catalog.dispose(handle.uri) == len(meta.files) + 1
    assert catalog.list_savepoints() == []
    assert catalog.latest() == meta  # the checkpoint is untouched
    assert catalog.dispose(handle.uri) == 0  # already gone


def test_ids_of_disposed_snapshots_are_never_handed_out_again(catalog: Catalog,
                                                              make_checkpoint: MakeCheckpoint) -> None:
    """A rollback retires the newest checkpoint: the next one must not take its id (a
    sensor waiting for "a checkpoint after id N" would otherwise be misled)."""
    catalog.claim_generation()
    make_checkpoint(catalog, state(0))
    newest = make_checkpoint(catalog, state(1))
    catalog.dispose(catalog.checkpoint_uri(newest.id))
    assert catalog.next_checkpoint_id() == newest.id + 1
    later = make_checkpoint(catalog, state(2))
    assert later.id == newest.id + 1
    handle = catalog.create_savepoint(catalog.handle(later))
    catalog.dispose(catalog.checkpoint_uri(later.id))
    catalog.dispose(handle.uri)
    assert catalog.next_checkpoint_id() == later.id + 1
    assert [m.id for m in catalog.checkpoints()] == [1]


@pytest.mark.parametrize("planted", ["oversized", "a list", "not JSON"])
def test_an_unreadable_id_floor_is_no_floor_with_a_warning(
    catalog: Catalog, make_checkpoint: MakeCheckpoint, caplog: pytest.LogCaptureFixture, planted: str
) -> None:
    """The id floor is read within its byte limit: one over it, or not an integer, is
    logged naming it and counts as no floor, never a failure of every checkpoint's
    numbering (pins the behaviour across the move to `bounded.read_record_or_warn`)."""
    catalog.claim_generation()
    newest = make_checkpoint(catalog, state(0))
    limit = layout.max_bytes_of(layout.ID_FLOOR)
    assert limit is not None
    data = {"oversized": b"7" * (limit + 1), "a list": b"[7]", "not JSON": b"seven"}[planted]
    catalog.store.put(layout.ID_FLOOR, data)
    with caplog.at_level(logging.WARNING):
        assert catalog.next_checkpoint_id() == newest.id + 1
    assert any(layout.ID_FLOOR in r.getMessage() for r in caplog.records), \
        "the warning does not name the record"


def test_dispose_refuses_paths_outside_the_job(root: Any, catalog: Catalog,
                                               make_checkpoint: MakeCheckpoint) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, state(0))
    handle = catalog.create_savepoint(catalog.handle(meta))
    scheme_root = catalog.uri.rsplit("/orders", 1)[0]
    with pytest.raises(InvalidPath, match=r"contains '\.' or '\.\.' segments"):
        catalog.dispose(f"{catalog.uri}/savepoints/../chk-1")
    with pytest.raises(InvalidPath, match=r"'\.\.'"):
        catalog.dispose("../payments/chk-1")
    with pytest.raises(RestoreError, match="is outside job 'orders'"):
        catalog.dispose(f"{scheme_root}/payments/chk-1")
    with pytest.raises(RestoreError, match="is outside job 'orders'"):
        catalog.dispose("s3://some-other-bucket/root/orders/chk-1")
    with pytest.raises(RestoreError, match="is not a checkpoint or savepoint directory"):
        catalog.dispose(f"{catalog.uri}/shared")
    with pytest.raises(RestoreError, match="is not a checkpoint or savepoint directory"):
        catalog.dispose(f"{handle.uri}/files")
    with pytest.raises(InvalidPath, match="is empty"):
        catalog.dispose("")
    assert catalog.latest() == meta and catalog.list_savepoints()[0].valid


# --------------------------------------------------------------------------- generations


def test_claim_generation_threads_get_distinct_consecutive_numbers(catalog: Catalog) -> None:
    barrier = threading.Barrier(16)
    claimed: list[int] = []
    lock = threading.Lock()

    def claim() -> None:
        mine = Catalog(catalog.storage, "orders")
        barrier.wait()
        number = mine.claim_generation({"thread": threading.get_ident()}).generation
        with lock:
            claimed.append(number)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == list(range(1, 17))
    assert catalog.current_generation() == 16


def _claim_in_process(uri: str, options: dict[str, Any], barrier: Any, results: Any) -> None:
    catalog = Catalog(open_storage(uri, **options), "orders")
    catalog.current_generation()  # warm up the client before the race
    barrier.wait(timeout=60)
    results.put(catalog.claim_generation().generation)


@pytest.mark.parametrize("root", ["local", pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
def test_claim_generation_processes_race(root: Any) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(root.uri, root.options, barrier, results))
             for _ in range(4)]
    for proc in procs:
        proc.start()
    numbers = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert sorted(numbers) == [1, 2, 3, 4]


def test_stale_generation_cannot_complete_a_checkpoint(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    old = catalog.claim_generation().generation
    catalog.check_generation(old)
    new = Catalog(catalog.storage, "orders").claim_generation().generation
    assert new == old + 1
    with pytest.raises(StaleGeneration,
                       match=f"generation {old} of job 'orders' was superseded by generation {new}"):
        catalog.check_generation(old)
    with pytest.raises(StaleGeneration):
        make_checkpoint(catalog, state(0), generation=old)
    assert catalog.checkpoint_ids() == []
    make_checkpoint(catalog, state(0), generation=new)


# --------------------------------------------------------------------------- transactions, status


def test_transactions_put_list_delete(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    records = [transaction_record("DeltaSink", b, g, job="orders", sink_id="s", payload={"files": [f"f{b}"]},
                                  created_at=1.0)
               for b, g in [(3, 1), (1, 1), (3, 2)]]
    for record in records:
        catalog.put_transaction(record)
    catalog.put_transaction(records[0])  # re-recording is idempotent
    assert [(r.batch_id, r.generation) for r in catalog.transactions()] == [(1, 1), (3, 1), (3, 2)]
    catalog.store.put(layout.txn_key(9, 1), b"[not an object]")
    with caplog.at_level(logging.WARNING):
        assert len(catalog.transactions()) == 3
    assert "unreadable transaction record" in caplog.text
    catalog.delete_transactions(records[:2])
    assert catalog.transactions() == [records[2]]


def test_status_round_trip(catalog: Catalog) -> None:
    catalog.write_status({"job": "orders", "generation": 2, "state": "running", "heartbeat_at": 5.0})
    assert (catalog.read_status()
            == {"job": "orders", "generation": 2, "state": "running", "heartbeat_at": 5.0})
    catalog.store.put(layout.STATUS, b"[1]")
    assert catalog.read_status() is None


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("job", ["../x", "", "a b", "x/y", ".hidden", "a..b", "x" * 129])
def test_invalid_job_names(job: str) -> None:
    with pytest.raises(ConfigError, match="job name .* is invalid"):
        Catalog(MemoryStorage("bad-input"), job)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "is empty"),
        ("ftp://host/x", "unsupported scheme 'ftp'"),
        ("s3:///prefix", "has no bucket"),
        ("file://otherhost/x", "names host 'otherhost'"),
        ("s3://Bad_Bucket/x", "bucket name 'Bad_Bucket' is invalid"),
    ],
)
def test_malformed_uris(uri: str, message: str) -> None:
    with pytest.raises(InvalidPath, match=message):
        Catalog.open(uri, "orders")


def test_remembered_checkpoints_never_outrank_the_listing_or_the_file_check(
    catalog: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    """`KnownRecords` saves the ``_metadata`` reads of each pass (issue 32), but a checkpoint
    whose directory the listing no longer shows is not kept on memory alone, and one whose
    shared file went is invalid like before: the older valid one is kept instead."""
    from airflow_sparkpoint.checkpoints.retention import KnownRecords

    catalog.claim_generation()
    known = KnownRecords()
    written = [make_checkpoint(catalog, state(v)) for v in range(3)]
    enforce_checkpoint_retention(catalog, 2, known=known)
    assert sorted(known.checkpoints) == [written[1].id, written[2].id]
    # The newest loses a file it alone references (deleted by hand): not restorable.
    only_newest = {r.key for r in written[2].files} - {r.key for r in written[1].files}
    assert only_newest
    catalog.store.delete(only_newest)
    result = enforce_checkpoint_retention(catalog, 1, known=known, grace_seconds=3600)
    assert result.deleted_checkpoints == ()  # trusting memory would keep the newest and delete chk-2
    assert [m.id for m in catalog.checkpoints()] == [written[1].id]  # chk-1 deleted in the first pass
    # A remembered checkpoint disposed by hand is forgotten, not counted among the kept.
    catalog.dispose(layout.checkpoint_dir(written[1].id))
    enforce_checkpoint_retention(catalog, 2, known=known)
    assert written[1].id not in known.checkpoints


def test_a_running_job_numbers_checkpoints_from_a_recent_listing_of_its_savepoints(
        root: Any, catalog: Catalog, make_checkpoint: MakeCheckpoint,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: a job that keeps its savepoints listed ``savepoints/`` at every checkpoint
    (a listing that grows with them). With `recent_savepoints` one listing serves for
    `SAVEPOINT_IDS_TTL_S`; the savepoints the catalog makes count at once, and one made by
    another process (of a savepoint: a new id) is seen once the listing is that old."""
    from airflow_sparkpoint.checkpoints import snapshot_store
    from airflow_sparkpoint.storage.counting import CountingStorage

    clock = [1000.0]
    monkeypatch.setattr(snapshot_store.time, "monotonic", lambda: clock[0])
    catalog.claim_generation()
    first = make_checkpoint(catalog, state(0))
    counted = CountingStorage(root.open())
    job = Catalog(counted, catalog.job)

    def savepoint_listings() -> int:
        return sum(1 for op, key in counted.log
                   if op == "list_dirs" and key.rstrip("/").endswith(layout.SAVEPOINTS))

    assert job.next_checkpoint_id(recent_savepoints=True) == first.id + 1
    assert job.next_checkpoint_id(recent_savepoints=True) == first.id + 1
    assert savepoint_listings() == 1, "the second numbering used the first listing"
    assert job.next_checkpoint_id() == first.id + 1 and savepoint_listings() == 2, "exact by default"

    # a savepoint of a savepoint: a new id
    own = job.create_savepoint(job.create_savepoint(job.handle(first)))
    assert job.next_checkpoint_id(recent_savepoints=True) == own.metadata.id + 1, \
        "its own savepoints count at once"

    other = catalog.create_savepoint(own)  # another process
    clock[0] += snapshot_store.SAVEPOINT_IDS_TTL_S
    listed = savepoint_listings()
    assert job.next_checkpoint_id(recent_savepoints=True) == other.metadata.id + 1
    assert savepoint_listings() == listed + 1
