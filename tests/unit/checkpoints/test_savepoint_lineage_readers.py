"""A lineage that stands at the savepoint it started from (restored by path, no checkpoint
of its own yet): what its readers do. The commit step confirms against the savepoint (or
the pin, or a copy outside the root on the root's service; none on another service);
``restore=none`` is refused; (the retry's choice: tests/unit/services/test_retry_savepoint_lineage.py). Found
in review of 4e6525e and f04c19a."""

from __future__ import annotations

import uuid

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.catalog_types import SnapshotHandle
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.exceptions import RestoreError
from airflow_sparkpoint.runtime.restore import pin_restart_point, plan_restore
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import run_config
from tests.support.fake_sinks import RecordingLineageSink
from tests.support.records import put_checkpoint, transaction_record


def _state(batch: int) -> dict[str, bytes]:
    return {f"commits/{batch}": f"c{batch}".encode(), "state": f"after {batch}".encode()}


def _first_lineage_and_its_savepoint(bucket: str) -> tuple[Catalog, int, SnapshotMetadata, SnapshotHandle]:
    """Generation 1 (external commit mode) checkpoints batches 0 and 1 (chk-1, chk-2; both
    transactions pending: the commit step has not run); a savepoint S is copied from chk-2."""
    mem = Catalog(MemoryStorage(bucket), "job")
    first = mem.claim_generation().generation
    mem.write_origin(new_origin(first, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                id_floor=0, restore={}, live_dir=None, host="h", pid=1))
    mem.put_transaction(transaction_record(RecordingLineageSink(), 0, first))
    put_checkpoint(mem, _state(0), batch_id=0, pending=[transaction_record(RecordingLineageSink(), 0, first)])
    mem.put_transaction(transaction_record(RecordingLineageSink(), 1, first))
    chk = put_checkpoint(mem, _state(1), batch_id=1,
                         pending=[transaction_record(RecordingLineageSink(), 0, first),
                                  transaction_record(RecordingLineageSink(), 1, first)])
    return mem, first, chk, mem.create_savepoint(mem.handle(chk))


def _savepoint_lineage() -> tuple[Catalog, str, int, int]:
    """Generation 1 (external commit mode) checkpoints batches 0 and 1 (chk-1, chk-2;
    both transactions pending: the commit step has not run); a savepoint S is copied from
    chk-2. Generation 2 restores S by path, as the runtime plans it (`plan_restore`: base
    2, S's source checkpoint; a pin; the origin) and its recovery keeps S's pending
    transactions for the commit step. Then it dies before its first checkpoint (a crash,
    a kill, SIGTERM of a timed-out task, a failing first batch; a clean end checkpoints
    the restored batch in `RunCoordination.finish`): its lineage has no checkpoint."""
    mem, first, chk, savepoint = _first_lineage_and_its_savepoint(uuid.uuid4().hex)

    plan = plan_restore(run_config(restore=savepoint.uri), mem)
    assert plan.kind == "savepoint" and plan.base_id == chk.id
    second = mem.claim_generation().generation
    pin = pin_restart_point(plan, mem, second)
    meta = plan.snapshot.metadata
    mem.write_origin(new_origin(second, kind=plan.kind, uri=plan.snapshot.uri, base_id=plan.base_id,
                                snapshot_id=meta.id, batch_id=meta.batch_id,
                                id_floor=mem.next_checkpoint_id() - 1, restore={"restore": savepoint.uri},
                                live_dir=None, host="h", pid=2, pin=pin))
    point = mem.restart_point()
    assert point.uri == savepoint.uri and point.origin is not None and point.origin.generation == second
    return mem, savepoint.uri, first, second


def test_the_commit_step_commits_what_a_savepoint_lineage_confirms_before_its_first_checkpoint() -> None:
    """The window: the newest lineage stands at a savepoint S of this job (restored by
    path, no checkpoint of its own yet; its run died before its first checkpoint). S's
    pending transactions (batches 0 and 1 of generation 1) are confirmed by the restart
    point, and in external commit mode the start's recovery left them for the commit
    step. ``latest()`` now answers None for such a lineage, so the commit step commits
    nothing, however often it runs, until the lineage writes a checkpoint (every
    ``restore=latest`` start that fails before its first checkpoint restarts from S
    again): confirmed output stays invisible. Before 4e6525e ``latest()`` answered chk-2 (S's
    source, not superseded: id 2 is the origin's base) and the step committed both.
    """
    from airflow_sparkpoint.services import commit as commit_module

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    mem, savepoint, first, _second = _savepoint_lineage()
    for _ in range(3):  # the step runs again and again
        outcome = commit_module.commit_pending(mem, storage_options={})
    assert RecordingLineageSink.aborted == []
    assert RecordingLineageSink.committed_log == [(0, first), (1, first)], (
        f"the commit step left {outcome['pending']} pending although {savepoint}, the newest lineage's "
        "restart point, confirms them: latest() is None while the lineage stands at a savepoint")


def test_the_commit_step_confirms_against_the_lineages_pin_when_its_savepoint_and_base_are_gone() -> None:
    """The same savepoint lineage after savepoint retention disposed of S and checkpoint
    retention removed its source chk-2: ``restore=latest`` restarts from the pin its
    generation owns, and the commit step confirms against that pin (read through the
    catalog's own store), not against an older checkpoint or nothing."""
    from airflow_sparkpoint.checkpoints import layout
    from airflow_sparkpoint.services import commit as commit_module

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    mem, savepoint, first, second = _savepoint_lineage()
    origin = next(o for o in mem.origins() if o.generation == second)
    assert origin.pin is not None
    mem.store.delete_prefix(mem.snapshot_store.key_of(savepoint))
    mem.store.delete_prefix(layout.checkpoint_dir(2))
    outcome = commit_module.commit_pending(mem, storage_options={})
    assert RecordingLineageSink.aborted == []
    assert RecordingLineageSink.committed_log == [(0, first), (1, first)], outcome


def test_restore_none_is_refused_while_the_newest_lineage_stands_at_a_savepoint() -> None:
    """The window: the same savepoint lineage with no checkpoint of its own yet; the job
    has completed checkpoints (chk-1, chk-2) and a restart point with state (S). A start
    with ``restore=none`` and no ``restore.force`` must be refused (`plan_restore`: "has
    completed checkpoints ... set restore.force=true"). The refusal asks ``latest()``,
    which is None now for a savepoint (or pin) lineage, so the start is planned as empty
    state and, in external mode, its `settle_unconfirmed` aborts S's confirmed pending
    transactions (batches 0 and 1: their output is lost) without the force the contract
    asks for.
    Before 4e6525e ``latest()`` answered chk-2 and the start was refused.
    """
    mem, savepoint, _first, _second = _savepoint_lineage()
    with pytest.raises(RestoreError, match="restore=none"):
        plan = plan_restore(run_config(restore="none"), mem)
        pytest.fail(f"restore=none planned {plan.description!r} without restore.force while the newest "
                    f"lineage stands at {savepoint}")


def test_the_commit_step_commits_what_a_moved_savepoint_lineage_confirms_before_its_first_checkpoint(
    
) -> None:
    """The window: generation 1 (external commit mode) checkpoints batches 0 and 1, both
    transactions pending; a savepoint S of chk-2 is copied out of the job root (a moved
    savepoint, which `recover_transactions` supports: "a snapshot from another root") and
    generation 2 restores that copy by path. It is this job's snapshot, so the start's
    recovery keeps S's pending transactions (records in this root) for the commit step
    (external mode); no pin is taken (not under the root). The run dies before its first
    checkpoint. ``restore=latest`` restarts from the copy (`plan_restore` opens any URI),
    but `_standing` opens only URIs inside the root (`SnapshotStore.open_in_root`: "outside
    job"), finds no pin and answers None: the step commits nothing however often it runs,
    confirmed output stays invisible until the lineage checkpoints (forever if every
    restart dies before its first checkpoint). The same hold-back f04c19a fixed for a
    savepoint inside the root."""
    from airflow_sparkpoint.services import commit as commit_module

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    bucket = uuid.uuid4().hex
    mem, first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    key = mem.snapshot_store.key_of(savepoint.uri)
    raw = MemoryStorage(bucket)
    for info in list(raw.list(f"job/{key}/")):
        raw.copy(info.key, "moved/" + info.key[len(f"job/{key}/"):])
    moved = f"memory://{bucket}/moved"

    plan = plan_restore(run_config(restore=moved), mem)
    assert plan.snapshot is not None and plan.snapshot.metadata.job == "job"
    second = mem.claim_generation().generation
    pin = pin_restart_point(plan, mem, second)
    assert pin is None  # not under the root: nothing pinned (the path this test exercises)
    meta = plan.snapshot.metadata
    mem.write_origin(new_origin(second, kind=plan.kind, uri=plan.snapshot.uri, base_id=plan.base_id,
                                snapshot_id=meta.id, batch_id=meta.batch_id,
                                id_floor=mem.next_checkpoint_id() - 1, restore={"restore": moved},
                                live_dir=None, host="h", pid=2, pin=pin))
    point = mem.restart_point()
    assert point.uri == moved and point.checkpoint is None  # restore=latest restarts from the copy
    again = plan_restore(run_config(restore="latest"), mem)
    assert again.snapshot is not None and again.snapshot.metadata.batch_id == 1

    for _ in range(3):  # the step runs again and again
        outcome = commit_module.commit_pending(mem, storage_options={})
    assert RecordingLineageSink.aborted == []
    assert RecordingLineageSink.committed_log == [(0, first), (1, first)], (
        f"the commit step left {outcome['pending']} pending although {moved}, the newest lineage's "
        "restart point, confirms them: _standing opens only snapshots inside the root")


def _start_from_moved(mem: Catalog, savepoint: SnapshotHandle, moved: str, **conf: str) -> int:
    """Copy `savepoint`'s files to `moved` (outside `mem`'s root) and start the next
    generation of `mem`'s job from that copy by path, as the runtime plans it (no pin:
    not under the root; the origin names the copy). Returns the generation."""
    from airflow_sparkpoint.storage import open_storage

    target = open_storage(moved)
    for info in list(savepoint.files_store.list()):
        target.put(info.key, savepoint.files_store.get(info.key))
    plan = plan_restore(run_config(restore=moved, **conf), mem)
    assert plan.snapshot is not None
    generation = mem.claim_generation().generation
    assert pin_restart_point(plan, mem, generation) is None
    meta = plan.snapshot.metadata
    mem.write_origin(new_origin(generation, kind=plan.kind, uri=plan.snapshot.uri, base_id=plan.base_id,
                                snapshot_id=meta.id, batch_id=meta.batch_id,
                                id_floor=mem.next_checkpoint_id() - 1, restore={"restore": moved},
                                live_dir=None, host="h", pid=2, pin=None))
    assert mem.restart_point().uri == moved.rstrip("/")
    return generation


def _replace_moved(bucket: str, snapshot: SnapshotHandle) -> None:
    """Put `snapshot`'s files where `_start_from_moved` copied the savepoint
    (``memory://<bucket>/moved``), in place of the copy: a shared place changed since."""
    raw = MemoryStorage(bucket)
    raw.delete_prefix("moved/")
    for info in list(snapshot.files_store.list()):
        raw.put("moved/" + info.key, snapshot.files_store.get(info.key))


def _step_settles(mem: Catalog) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[str]]:
    from airflow_sparkpoint.services import commit as commit_module

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    for _ in range(2):
        outcome = commit_module.commit_pending(mem, storage_options={})
    return list(RecordingLineageSink.committed_log), list(RecordingLineageSink.aborted), outcome["pending"]


def test_the_commit_step_holds_back_a_lineage_started_from_a_savepoint_on_another_service(tmp_path) -> None:
    """The moved savepoint lies on another storage service than the root (here a local
    directory beside a memory root; in production another S3 endpoint or scheme): the
    step holds no options for it, so the lineage's transactions stay pending until its
    first checkpoint; nothing is aborted."""
    mem, _first, _chk, savepoint = _first_lineage_and_its_savepoint(uuid.uuid4().hex)
    _start_from_moved(mem, savepoint, str(tmp_path / "moved"))
    committed, aborted, pending = _step_settles(mem)
    assert (committed, aborted) == ([], []) and sorted(pending) == ["job-b0-g1", "job-b1-g1"]


def test_the_commit_step_holds_back_when_the_moved_savepoint_is_deleted_after_the_start() -> None:
    """The moved copy (same service) is deleted after the lineage started from it: the
    step cannot read what the lineage confirms and holds back (never aborts)."""
    bucket = uuid.uuid4().hex
    mem, _first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    _start_from_moved(mem, savepoint, f"memory://{bucket}/moved")
    MemoryStorage(bucket).delete_prefix("moved/")
    committed, aborted, pending = _step_settles(mem)
    assert (committed, aborted) == ([], []) and sorted(pending) == ["job-b0-g1", "job-b1-g1"]


def test_the_commit_step_holds_back_when_the_moved_savepoint_was_replaced_by_another_snapshot() -> None:
    """The moved path now holds another snapshot of this job (chk-1's, batch 0) than the
    one the lineage restored (chk-2's, batch 1): it is not what the lineage confirms, so
    nothing is confirmed or aborted by it (read as the lineage's, it would commit batch 0
    by a snapshot the lineage never restored)."""
    bucket = uuid.uuid4().hex
    mem, _first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    _start_from_moved(mem, savepoint, f"memory://{bucket}/moved")
    _replace_moved(bucket, mem.create_savepoint(mem.handle(mem.snapshot(1).metadata)))
    committed, aborted, pending = _step_settles(mem)
    assert (committed, aborted) == ([], []) and sorted(pending) == ["job-b0-g1", "job-b1-g1"]


def test_a_moved_savepoint_of_another_job_confirms_none_of_this_jobs_transactions() -> None:
    """Job ``other`` (same bucket) has a lineage whose savepoint confirms batches 0 and 1
    of generation 1, the same (batch, generation) pairs as this job's pending records.
    This job restores a copy of that savepoint moved out of ``other``'s root
    (``restore.allowForeignJob``): the step must not commit this job's records by it, nor
    abort them."""
    bucket = uuid.uuid4().hex
    other = Catalog(MemoryStorage(bucket), "other")
    gen = other.claim_generation().generation
    other.write_origin(new_origin(gen, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                  id_floor=0, restore={}, live_dir=None, host="h", pid=1))
    foreign = [transaction_record(RecordingLineageSink(), b, gen, job="other") for b in (0, 1)]
    chk = put_checkpoint(other, _state(1), batch_id=1, pending=foreign)
    foreign_savepoint = other.create_savepoint(other.handle(chk))

    mem = Catalog(MemoryStorage(bucket), "job")
    first = mem.claim_generation().generation
    assert first == gen
    mem.write_origin(new_origin(first, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                id_floor=0, restore={}, live_dir=None, host="h", pid=1))
    for b in (0, 1):
        mem.put_transaction(transaction_record(RecordingLineageSink(), b, first))
    _start_from_moved(mem, foreign_savepoint, f"memory://{bucket}/moved",
                      **{"restore.allowForeignJob": "true"})
    committed, aborted, pending = _step_settles(mem)
    assert (committed, aborted) == ([], []) and sorted(pending) == ["job-b0-g1", "job-b1-g1"]


def _rollback_after_moved_start(moved_of: str) -> tuple[Catalog, int, list[tuple[int, int]]]:
    """Generation 1's lineage, its savepoint moved to `moved_of(bucket)` and generation 2
    started from the copy by path (no pin, no base in the root); then the rollback of
    generation 1 is asked for. Returns the catalog, generation 1 and what was aborted."""
    from airflow_sparkpoint.services.rollback import abort_generation

    bucket = uuid.uuid4().hex
    mem, first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    _start_from_moved(mem, savepoint, moved_of.format(bucket=bucket))
    RecordingLineageSink.aborted.clear()
    with pytest.raises(RestoreError, match="continues"):
        abort_generation(mem, first, storage_options={})
    return mem, first, list(RecordingLineageSink.aborted)


def test_a_rollback_of_a_generation_a_moved_copy_continues_is_refused() -> None:
    """Found by the exploration of the simulation's moved restores (branch wt-moved,
    20297413:1686): generation 2 restored a copy of generation 1's savepoint moved out of
    the root (same service); the rollback of generation 1 read only the root's checkpoints
    and the origins' ``base_id`` (none for the copy), aborted batches 0 and 1, which the
    copy confirms, and the lineage's restart then failed with "was aborted since". The
    rollback reads the copy and refuses: a newer run continues generation 1's lineage."""
    mem, _first, aborted = _rollback_after_moved_start("memory://{bucket}/moved")
    assert aborted == [] and sorted(t.txn_id for t in mem.transactions()) == ["job-b0-g1", "job-b1-g1"]


def test_a_rollback_refuses_while_a_newer_lineage_s_moved_copy_cannot_be_read(tmp_path) -> None:
    """The copy lies on another service (no options for it here): whether it continues
    generation 1 cannot be told, so the rollback refuses (never aborts what it may confirm)."""
    mem, _first, aborted = _rollback_after_moved_start(str(tmp_path / "moved-{bucket}"))
    assert aborted == [] and sorted(t.txn_id for t in mem.transactions()) == ["job-b0-g1", "job-b1-g1"]


def test_restore_latest_refuses_a_moved_savepoint_replaced_by_another_snapshot() -> None:
    """The moved path now holds another snapshot of this job (chk-1's, batch 0) than the
    one the lineage restored (chk-2's, batch 1), and the lineage has no checkpoint of its
    own: ``restore=latest`` restarted from whatever the path held, state the lineage never
    had (found by a review: the commit step compared the snapshot with the origin, the
    restart did not). It is refused, naming both snapshots; nothing was written."""
    bucket = uuid.uuid4().hex
    mem, _first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    _start_from_moved(mem, savepoint, f"memory://{bucket}/moved")
    _replace_moved(bucket, mem.create_savepoint(mem.handle(mem.snapshot(1).metadata)))
    raw = MemoryStorage(bucket)
    before = sorted(i.key for i in raw.list(""))
    with pytest.raises(RestoreError, match=r"holds snapshot \d+ \(batch 0\), not snapshot \d+ \(batch 1\)"):
        plan_restore(run_config(restore="latest"), mem)
    assert sorted(i.key for i in raw.list("")) == before


def test_a_rollback_refuses_while_a_newer_lineage_s_moved_copy_holds_another_snapshot() -> None:
    """The copy generation 2 started from was replaced by a snapshot of another job, which
    confirms nothing of generation 1: read as is, the rollback would abort batches 0 and
    1, which the copy generation 2 restored confirms. What that lineage restored cannot be
    told any more, so the rollback refuses (as for a copy it cannot read)."""
    from airflow_sparkpoint.services.rollback import abort_generation

    bucket = uuid.uuid4().hex
    mem, first, _chk, savepoint = _first_lineage_and_its_savepoint(bucket)
    _start_from_moved(mem, savepoint, f"memory://{bucket}/moved")
    other = Catalog(MemoryStorage(bucket), "other")
    other.claim_generation()
    _replace_moved(bucket, other.create_savepoint(other.handle(put_checkpoint(other, _state(0), batch_id=0))))
    RecordingLineageSink.aborted.clear()
    with pytest.raises(RestoreError, match="replaced since"):
        abort_generation(mem, first, storage_options={})
    assert RecordingLineageSink.aborted == []
    assert sorted(t.txn_id for t in mem.transactions()) == ["job-b0-g1", "job-b1-g1"]


@pytest.mark.parametrize("fault", ["none", "read-error"])
def test_a_rollback_refuses_while_a_savepoint_lineage_s_start_cannot_be_read(
        fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation 2 started from S (in the root, pinned) and the first lineage's
    checkpoints are gone (retention). The rollback of generation 1 reads S, else its pin:
    both confirm batches 0 and 1, so it is refused. When reading them fails (a store
    error: S3's 503), they are still there: the rollback may not take them for gone
    (found by a review of 9893eb7: it aborted batches 0 and 1), so it is refused too."""
    from airflow_sparkpoint.exceptions import StorageError
    from airflow_sparkpoint.services.rollback import abort_generation

    mem, _s_uri, first, _second = _savepoint_lineage()
    for checkpoint in mem.checkpoints():
        mem.snapshot_store.delete_checkpoint(f"chk-{checkpoint.id}")
    if fault == "read-error":
        get = MemoryStorage.get

        def failing(self: MemoryStorage, key: str, max_bytes: int | None = None) -> bytes:
            if key.endswith("/_metadata") and ("/savepoints/" in key or "/pins/" in key):
                raise StorageError(f"503 SlowDown reading {self.uri}/{key}")
            return get(self, key, max_bytes)

        monkeypatch.setattr(MemoryStorage, "get", failing)
    RecordingLineageSink.aborted.clear()
    with pytest.raises(RestoreError, match="continues it"):
        abort_generation(mem, first, storage_options={})
    assert RecordingLineageSink.aborted == []
    assert sorted(t.txn_id for t in mem.transactions()) == ["job-b0-g1", "job-b1-g1"]
