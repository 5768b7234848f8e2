"""Claim, then act, without Spark: validate-before-complete, fenced recovery and aborts,
live-location ownership (a real flock held by another process) and hard-linked
materialization."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.retention import journal_deletions
from airflow_sparkpoint.exceptions import StaleGeneration
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.recovery import recover_transactions
from airflow_sparkpoint.runtime.restore import (
    RestorePlan,
    choose_live,
    fill_live,
    plan_restore,
)
from airflow_sparkpoint.storage import MemoryStorage
from airflow_sparkpoint.storage.localfs import Dir
from tests.support.checkpointers import checkpointer, run_config
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live
from tests.support.records import job_status, write_status


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog(MemoryStorage(uuid.uuid4().hex), "job")


# ---------------------------------------------------------------------------- validate before completing


def test_a_shared_file_deleted_under_the_index_is_copied_again_before_metadata(catalog, tmp_path):
    """Issue #15 hole 4: one missing shared file must not make every later checkpoint invalid."""
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    first = coord.checkpoint(0)
    victim = next(ref.key for ref in first.files if ref.path == "metadata")
    catalog.store.delete([victim])  # by hand, a lifecycle rule, another process
    assert not catalog.list_checkpoints()[0].valid

    write_live(tmp_path, 1)
    second = coord.checkpoint(1)

    assert second is not None and catalog.store.exists(victim)
    assert [e.valid for e in catalog.list_checkpoints()] == [True, True]
    assert second.stats.bytes_copied >= next(ref.size for ref in second.files if ref.key == victim)


def test_a_journaled_deletion_after_the_listing_is_copied_again(catalog, tmp_path, monkeypatch):
    """Another process's retention deletes a referenced file between this checkpoint's
    listing of shared/ and its _metadata: the write-ahead journal tells."""
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    first = coord.checkpoint(0)
    victim = next(ref.key for ref in first.files if ref.path == "metadata")
    real_list = catalog.store.list

    def listing_then_delete(prefix: str = "") -> Any:
        items = list(real_list(prefix))
        if prefix == layout.SHARED:
            journal_deletions(catalog, [victim], None)
            catalog.store.delete([victim])
        return iter(items)

    monkeypatch.setattr(catalog.store, "list", listing_then_delete)
    write_live(tmp_path, 1)
    assert coord.checkpoint(1) is not None
    monkeypatch.setattr(catalog.store, "list", real_list)
    assert catalog.store.exists(victim) and all(e.valid for e in catalog.list_checkpoints())


def _watch_shared_listing(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once a listing of shared/ has returned (the store's `list` patched)."""
    listed = threading.Event()
    real_list = catalog.store.list

    def listing(prefix: str = "") -> Any:
        items = list(real_list(prefix))
        if prefix == layout.SHARED:
            listed.set()
        return iter(items)

    monkeypatch.setattr(catalog.store, "list", listing)
    return listed


def test_a_file_the_checkpoint_uploaded_then_another_process_deleted_is_copied_again(
    catalog, tmp_path, monkeypatch
):
    """The listing of shared/ runs beside the uploads, so it cannot show that a file the
    checkpoint uploaded was deleted after; the journal, listed after the uploads, does."""
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    real_upload = catalog.store.upload_file
    victims: list[str] = []

    def upload_then_delete(local_path: str, key: str) -> None:
        real_upload(local_path, key)
        if not victims and key.startswith(f"{layout.SHARED}/metadata~"):
            assert listed.wait(10), "the listing of shared/ did not run beside the uploads"
            time.sleep(0.2)  # whatever else the listing thread does, it has done by now
            journal_deletions(catalog, [key], None)
            catalog.store.delete([key])
            victims.append(key)

    listed = _watch_shared_listing(catalog, monkeypatch)
    monkeypatch.setattr(catalog.store, "upload_file", upload_then_delete)
    first = coord.checkpoint(0)
    monkeypatch.undo()

    assert first is not None and victims, "the deletion did not happen"
    assert catalog.store.exists(victims[0]) and all(e.valid for e in catalog.list_checkpoints())


def test_a_damaged_copy_the_checkpoint_uploads_again_counts_with_its_new_size(catalog, tmp_path):
    """A shared file stored with another size (damaged by hand) that the checkpoint uploads
    again: retention judges the new checkpoint by the new size (it is valid, so the older
    checkpoint goes), not by the listing taken beside the upload."""
    import hashlib

    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, num_retained=1)
    write_live(tmp_path, 0)
    assert coord.checkpoint(0) is not None
    write_live(tmp_path, 1)
    damaged = catalog.shared_key("offsets/1", hashlib.sha256(b"o1").hexdigest())
    catalog.store.put(damaged, b"o1 and more")

    second = coord.checkpoint(1)

    assert second is not None and catalog.store.get(damaged) == b"o1"
    assert [m.batch_id for m in catalog.checkpoints()] == [1]


def test_a_deletion_nobody_journals_during_long_uploads_is_still_caught(catalog, tmp_path, monkeypatch):
    """Uploads that outlast `RELIST_AFTER_S` are followed by a second listing of shared/, so
    a file deleted by hand while they ran is copied again, as when the listing came after:
    one an older checkpoint stored, and one this checkpoint has just uploaded."""
    from airflow_sparkpoint.runtime import checkpointer as checkpointer_module

    monkeypatch.setattr(checkpointer_module, "RELIST_AFTER_S", 0.2, raising=False)
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    first = coord.checkpoint(0)
    victim = next(ref.key for ref in first.files if ref.path == "metadata")
    listed = _watch_shared_listing(catalog, monkeypatch)
    real_upload = catalog.store.upload_file
    deleted: list[str] = []

    def slow_upload(local_path: str, key: str) -> None:
        assert listed.wait(10)
        if not deleted:
            catalog.store.delete([victim])  # by hand: no journal entry
            deleted.append(victim)
        time.sleep(0.3)
        real_upload(local_path, key)
        if key.startswith(f"{layout.SHARED}/commits/1~") and len(deleted) == 1:
            catalog.store.delete([key])  # by hand, right after this checkpoint stored it
            deleted.append(key)

    monkeypatch.setattr(catalog.store, "upload_file", slow_upload)
    write_live(tmp_path, 1)
    second = coord.checkpoint(1)
    monkeypatch.undo()

    assert second is not None and len(deleted) == 2, deleted
    assert all(catalog.store.exists(key) for key in deleted)
    assert all(e.valid for e in catalog.list_checkpoints())


def test_the_coordinator_keeps_young_orphans_another_generation_may_be_uploading(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, timeout_s=600)
    catalog.store.put("shared/state/0/0/9.changelog~feedfacefeedface", b"uploaded by a newer generation")
    for batch in range(3):
        write_live(tmp_path, batch)
        assert coord.checkpoint(batch) is not None
    assert catalog.store.exists("shared/state/0/0/9.changelog~feedfacefeedface")


def test_a_taken_checkpoint_id_moves_to_the_next_one(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    real = catalog.next_checkpoint_id
    calls: list[int] = []

    def racing(ids: object = None, **kw: bool) -> int:
        value = real(ids, **kw)  # type: ignore[arg-type]
        if not calls:  # a zombie completes the same id first
            catalog.store.put(layout.checkpoint_metadata(value), b"someone else's")
        calls.append(value)
        return value

    catalog.next_checkpoint_id = racing  # type: ignore[method-assign]
    meta = coord.checkpoint(0)
    assert meta is not None and meta.id == calls[0] + 1


# ---------------------------------------------------------------------------- fenced recovery and aborts


def test_recovery_stops_at_once_when_a_newer_generation_claimed(catalog, tmp_path):
    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    plan = plan_restore(run_config(), catalog)
    mine = catalog.claim_generation().generation
    newer = catalog.claim_generation().generation
    catalog.put_transaction(recording_record(1, newer))  # the newer generation's staged batch
    sink = RecordingSink()
    with pytest.raises(StaleGeneration):
        recover_transactions(catalog, sink, plan, "external", mine)
    assert sink.aborted == [] and [r.generation for r in catalog.transactions()] == [newer]


def test_recovery_finishes_a_transaction_that_holds_its_batch_and_never_aborts_it(catalog, tmp_path):
    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    # promoted (the sink holds it), killed before the record went
    catalog.put_transaction(recording_record(1, gen1))
    catalog.put_transaction(recording_record(2, gen1))  # staged only
    sink = RecordingSink()
    sink.committed = {1: gen1}
    gen2 = catalog.claim_generation().generation
    _pending, summary = recover_transactions(catalog, sink, plan_restore(run_config(), catalog), "checkpoint",
                                             gen2)
    assert summary["finished"] == [1] and summary["aborted"] == [2]
    assert sink.aborted == [(2, gen1)] and catalog.transactions() == []


def test_a_superseded_generation_cannot_abort_at_stop(catalog, tmp_path):
    old = catalog.claim_generation().generation
    sink = RecordingSink()
    coord = checkpointer(catalog, tmp_path, sink, old)
    coord.transactions.add_pending(recording_record(3, old))
    catalog.claim_generation()
    with pytest.raises(StaleGeneration):
        coord.transactions.abort_unconfirmed(None)
    assert sink.aborted == []


# ---------------------------------------------------------------------------- live-location ownership

_HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(os.path.join(sys.argv[1], '.sparkpoint-lock'), os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_location_locked_by_a_live_process_is_never_shared(tmp_path):
    live = tmp_path / "g1"
    live.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(live)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        assert livedir.try_lock(str(live)) is None
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock
        holder.wait()
        holder.stdin.close()  # type: ignore[union-attr]
        holder.stdout.close()  # type: ignore[union-attr]
    lock = livedir.try_lock(str(live))
    assert lock is not None
    assert livedir.try_lock(str(live)) is None, "exclusive within one process too"
    lock.release()


def test_the_previous_owner_is_proven_gone_only_by_its_end_or_its_dead_processes(tmp_path):
    live = str(tmp_path / "g3")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = {"generation": 3, "host": os.uname().nodename, "pid": dead.pid, "pid_start": "1", "jvm_pid": 0}
    gone, why = livedir.previous_owner_gone(live, owner, None)
    assert gone, why
    alive = {**owner, "pid": os.getppid(), "pid_start": livedir.process_start(os.getppid())}
    assert not livedir.previous_owner_gone(live, alive, None)[0]
    reused = {**alive, "pid_start": "12345"}  # same pid, another process
    assert livedir.previous_owner_gone(live, reused, None)[0]
    finished = job_status("finished", generation=3, heartbeat_at=0.0, live_dir=live)
    assert livedir.previous_owner_gone(live, alive, finished)[0]
    remote = {**owner, "host": "elsewhere"}
    running = job_status(generation=3, heartbeat_at=0.0, live_dir=live)
    assert not livedir.previous_owner_gone(live, remote, running)[0]
    assert not livedir.previous_owner_gone(live, None, None)[0]


@pytest.mark.parametrize("body",
                         [b"[" * 60_000, b'{"a":' * 12_000 + b"1" + b"}" * 12_000, b"not json", b"[1, 2]"],
                         ids=["nested-list", "nested-object", "not-json", "not-an-object"])
def test_an_unreadable_owner_record_reads_as_none_never_a_crash(tmp_path, body):
    """The owner record lies in the shared work directory: a planted one nested past
    Python's recursion limit (well within its 64 KiB) is unreadable (None), as a garbled
    one is, never a RecursionError out of the start-up (`checkpoints.bounded`)."""
    live = tmp_path / "g3"
    live.mkdir()
    (live / livedir.OWNER_NAME).write_bytes(body)
    assert livedir.read_owner(str(live)) is None


def test_choose_live_resumes_in_place_only_when_the_owner_is_gone_and_links_otherwise(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    old = tmp_path / "work" / f"g{generation}"
    coord = checkpointer(catalog, old, RecordingSink(), generation)
    for batch in range(2):
        write_live(old, batch)
        coord.checkpoint(batch)
    livedir.write_owner(str(old), livedir.owner_record("job", generation, None))
    plan = plan_restore(run_config(), catalog)
    assert plan.own_checkpoint and plan.batch_id == 1
    status = job_status(generation=generation, heartbeat_at=0.0, live_dir=str(old))

    held = livedir.try_lock(str(old))  # the previous run is still alive
    assert held is not None
    before = {p: p.stat().st_mtime_ns for p in old.rglob("*") if p.is_file()}
    second = catalog.claim_generation().generation
    choice = choose_live(plan, [str(old)], status, work_root=str(tmp_path / "work"), job="job",
                         generation=second, jvm_pid=None)
    assert not choice.in_place and choice.path == str(tmp_path / "work" / f"g{second}")
    assert "held by a running generation" in choice.reason
    index, reuse = fill_live(choice, plan)
    assert (reuse.mode == "materialized" and reuse.linked == len(plan.snapshot.metadata.files)
            and reuse.downloaded == 0)
    assert set(index) == {f.path for f in plan.snapshot.metadata.files}
    assert (Path(choice.path) / "commits" / "1").read_text() == "c1"
    after = {p: p.stat().st_mtime_ns for p in old.rglob("*") if p.is_file() and p.name != livedir.OWNER_NAME}
    assert {p: t for p, t in before.items() if p.name != livedir.OWNER_NAME} == after, \
        "the old location changed"
    choice.lock.release()
    held.release()

    # The same process ran it and released the lock: its run is over, resume in place.
    third = catalog.claim_generation().generation
    again = choose_live(plan, [str(old)], status, work_root=str(tmp_path / "work"), job="job",
                        generation=third, jvm_pid=None)
    assert again.in_place and again.path == str(old)
    assert livedir.read_owner(str(old))["generation"] == third
    again.lock.release()


def test_an_empty_start_never_reuses_a_location(catalog, tmp_path):
    old = tmp_path / "elsewhere" / "live"
    write_live(old, 0)
    generation = catalog.claim_generation().generation
    choice = choose_live(RestorePlan(None, "empty"), [str(old)], None, work_root=str(tmp_path / "work"),
                         job="job", generation=generation, jvm_pid=None)
    _index, reuse = fill_live(choice, RestorePlan(None, "empty"))
    assert not choice.in_place and reuse.mode == "empty"
    assert sorted(os.listdir(choice.path)) == sorted([livedir.LOCK_NAME, livedir.OWNER_NAME])
    assert (old / "commits" / "0").exists()
    choice.lock.release()


def test_old_locations_are_removed_only_when_no_run_holds_them(tmp_path):
    work = tmp_path / "work"
    for name in ("g1", "g2", "g3"):
        (work / name).mkdir(parents=True)
    held = livedir.try_lock(str(work / "g2"))
    removed = livedir.remove_unowned(str(work), str(work / "g3"), 3)
    assert removed == [str(work / "g1")] and (work / "g2").exists() and (work / "g3").exists()
    assert held is not None
    held.release()


def test_an_old_location_is_out_of_every_runs_reach_before_its_files_are_deleted(tmp_path, monkeypatch):
    """Deleting a tree removes its lock file early: another run could then lock the half-deleted
    location and resume in place on it. It is moved out of the ``g<N>`` names under its lock
    first, and what a killed deletion left is deleted by the next pass."""
    work = tmp_path / "work"
    (work / "g1" / "state").mkdir(parents=True)
    (work / "g1" / "state" / "1.changelog").write_bytes(b"x")
    (work / "g3").mkdir()
    seen: list[tuple[str, bool]] = []
    remove_tree = Dir.remove_tree

    def watching(self, rel):
        seen.append((os.path.basename(rel), (work / "g1").exists()))
        return remove_tree(self, rel)

    monkeypatch.setattr(Dir, "remove_tree", watching)
    assert livedir.remove_unowned(str(work), str(work / "g3"), 3) == [str(work / "g1")]
    assert seen and all(not still for _name, still in seen), seen
    assert all(not name.startswith("g") for name, _still in seen), seen
    assert sorted(os.listdir(work)) == ["g3"]

    left = work / f"{livedir.TRASH_PREFIX}g2-0"  # a deletion killed halfway
    (left / "state").mkdir(parents=True)
    livedir.remove_unowned(str(work), str(work / "g3"), 3)
    assert sorted(os.listdir(work)) == ["g3"]


def test_a_retry_finishes_the_rewind_its_lineage_asked_for_and_only_that_one(catalog, tmp_path):
    """The run that asked for ``sinkAhead=rewind`` to checkpoint 1 died (before or during the
    rewind): a retry with default settings restores that same checkpoint and may rewind to
    it; a retry that has to go further back (that checkpoint is damaged) may not."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1, num_retained=3)
    metas = []
    for batch in range(3):
        write_live(tmp_path, batch)
        metas.append(coord.checkpoint(batch))
    gen2 = catalog.claim_generation().generation
    catalog.write_origin(new_origin(gen2, kind="checkpoint", uri=catalog.checkpoint_uri(metas[1].id),
                                    base_id=metas[1].id, snapshot_id=metas[1].id, batch_id=1,
                                    id_floor=metas[2].id,
                                    restore={"restore": "x", "sink_ahead": "rewind"}, live_dir=None, host="h",
                                    pid=1))
    sink = RecordingSink()
    sink.committed = {0: gen1, 1: gen1, 2: gen1}

    plan = plan_restore(run_config(), catalog)
    assert plan.batch_id == 1 and plan.sink_ahead == "rewind" and plan.continues is not None
    catalog.store.put(layout.checkpoint_metadata(metas[1].id), b"damaged")
    older = plan_restore(run_config(), catalog)
    assert older.batch_id == 0 and older.sink_ahead == "fail"
    from airflow_sparkpoint.exceptions import SinkAheadError
    from airflow_sparkpoint.runtime.restore import check_sink_position

    with pytest.raises(SinkAheadError):
        check_sink_position(older, sink, "job", apply=False)


# ---------------------------------------------------------------------------- the status record


def test_a_zombies_heartbeat_around_a_new_claim_does_not_hide_the_new_generation(catalog, monkeypatch):
    """Issue #27.4: the heartbeat of generation 1 checks that it is current, then (held
    there) generation 2 claims and writes its status, then generation 1's write lands. A
    control request must still be addressed to generation 2, the live run."""
    import time
    from types import SimpleNamespace

    from airflow_sparkpoint.checkpoints.generations import Fence
    from airflow_sparkpoint.checkpoints.history import live_status
    from airflow_sparkpoint.runtime.run_status import StatusWriter

    # only what the status writer reads: no Spark needed
    zombie = SimpleNamespace(cfg=SimpleNamespace(job="job"), catalog=catalog, built_checkpointer=None,
                             started_at=time.time(), savepoint_uri=None, application_id="app-1",
                             live_dir="/g1")
    zombie.generation = catalog.claim_generation().generation
    zombie.fence = Fence(catalog, zombie.generation)
    check = Fence.check
    claimed: list[int] = []

    def checked_then_a_claim(fence: Fence) -> None:
        check(fence)
        if not claimed:  # the zombie's check passed; generation 2 starts before its write
            claimed.append(0)
            claimed[0] = catalog.claim_generation().generation
            write_status(catalog, "running", generation=claimed[0])

    monkeypatch.setattr(Fence, "check", checked_then_a_claim)  # the run's fence: the one check
    StatusWriter(zombie).write("running")  # type: ignore[arg-type]
    monkeypatch.undo()

    assert claimed == [2]
    live = live_status(catalog, max_heartbeat_age=60)
    assert live is not None and live.generation == 2, f"control requests would go to {live}"


def test_a_location_another_lineage_ran_to_the_same_batch_is_not_resumed_in_place(catalog, tmp_path):
    """Two lineages forked from one checkpoint both reach batch 1 with the same query
    metadata: only the location the restored checkpoint was taken from is at its state
    (found by the simulation, seed 20261128 family generic: the retry resumed the other
    lineage's location in place and its batches carried that lineage's state)."""
    generation = catalog.claim_generation().generation
    ours = tmp_path / "work" / f"g{generation}"
    coord = checkpointer(catalog, ours, RecordingSink(), generation)
    for batch in range(2):
        write_live(ours, batch)
        coord.checkpoint(batch)
    other = tmp_path / "work" / "g9"  # another lineage's location, same batch, same metadata file
    write_live(other, 0)
    write_live(other, 1)
    (other / "state" / "0" / "0").mkdir(parents=True, exist_ok=True)
    (other / "state" / "0" / "0" / "2.delta").write_bytes(b"the other lineage's state")
    plan = plan_restore(run_config(), catalog)
    assert plan.own_checkpoint and plan.batch_id == 1 and plan.snapshot.metadata.live_root == str(ours)
    assert livedir.last_commit(str(other)) == 1  # what used to be enough
    status = job_status("failed", generation=generation, heartbeat_at=0.0, live_dir=str(other))
    second = catalog.claim_generation().generation
    choice = choose_live(plan, [str(other)], status, work_root=str(tmp_path / "work"), job="job",
                         generation=second, jvm_pid=None)
    assert not choice.in_place and choice.path == str(tmp_path / "work" / f"g{second}")
    choice.lock.release()
