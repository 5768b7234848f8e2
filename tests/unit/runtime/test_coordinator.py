"""The coordinator without Spark: a hand-made live location, an in-memory catalog and a
recording sink."""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import (
    RestoreError,
    SinkAheadError,
    SinkLineageError,
    SparkpointError,
    StaleGeneration,
    TransactionConflict,
)
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.recovery import recover_transactions
from airflow_sparkpoint.runtime.restore import (
    RestorePlan,
    check_sink_position,
    materialize,
    plan_restore,
)
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import catalog, checkpointer, commit, run_config
from tests.support.fake_sinks import ClaimingSink, RecordingSink, RewindingSink, recording_record
from tests.support.live_dirs import write_live

__all__ = ["catalog"]  # the fixture


def test_checkpoints_are_incremental_and_commit_after_completion(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    sink = RecordingSink()
    coord = checkpointer(catalog, tmp_path, sink, generation)
    write_live(tmp_path, 0)
    coord.transactions.add_pending(recording_record(0, generation))
    first = coord.checkpoint(0)
    assert first is not None and first.stats.files_copied == first.stats.file_count == 4
    assert sink.committed == {}  # nothing is visible before the commit step
    assert commit(coord) == [0]
    write_live(tmp_path, 1)
    coord.transactions.add_pending(recording_record(1, generation))
    second = coord.checkpoint(1)
    assert second is not None
    # Only the new offsets, commit and state version were copied.
    assert second.stats.files_copied == 3
    assert second.stats.bytes_copied < second.stats.bytes_total
    assert [t.batch_id for t in second.transactions] == [1]
    commit(coord)
    assert sink.committed == {0: generation, 1: generation}
    assert catalog.transactions() == []


def test_retention_keeps_num_retained_and_never_deletes_referenced_files(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, num_retained=2)
    for batch in range(5):
        write_live(tmp_path, batch)
        assert coord.checkpoint(batch) is not None
    kept = catalog.checkpoints()
    assert [c.batch_id for c in kept] == [4, 3]
    for meta in kept:
        for ref in meta.files:
            assert catalog.store.exists(ref.key)


def test_stale_generation_cannot_complete_a_checkpoint_or_commit(catalog, tmp_path):
    old = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), old)
    write_live(tmp_path, 0)
    coord.transactions.add_pending(recording_record(0, old))
    catalog.claim_generation()  # a newer run started
    with pytest.raises(StaleGeneration):
        coord.checkpoint(0)
    assert catalog.checkpoints() == []


def test_tolerable_failures_then_fail(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path / "missing-live", RecordingSink(), generation,
                         tolerable_failures=1)
    os.makedirs(tmp_path / "missing-live")
    write_live(tmp_path / "missing-live", 0)
    # Make the upload fail: the live file disappears between listing and copying.
    original = coord.catalog.store.upload_file

    def vanish(local_path: str, key: str) -> None:
        raise FileNotFoundError(local_path)

    coord.catalog.store.upload_file = vanish  # type: ignore[method-assign]
    assert coord.checkpoint(0) is None  # one failure tolerated
    with pytest.raises(SparkpointError, match="tolerableFailures=1"):
        coord.checkpoint(0)
    coord.catalog.store.upload_file = original  # type: ignore[method-assign]


def test_timeout_abandons_a_slow_checkpoint(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, timeout_s=1e-9, tolerable_failures=5)
    write_live(tmp_path, 0)
    assert coord.checkpoint(0) is None
    assert catalog.checkpoints() == []


def test_restore_none_is_refused_when_checkpoints_exist(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    with pytest.raises(RestoreError, match="restore.force=true"):
        plan_restore(run_config(restore="none"), catalog, None)
    assert plan_restore(run_config(restore="none", **{"restore.force": "true"}), catalog).snapshot is None
    assert plan_restore(run_config(), catalog, None).batch_id == 0


def test_a_savepoint_of_another_job_is_refused_unless_allowed(tmp_path):
    other = Catalog.open(str(tmp_path / "root"), "other")
    live = tmp_path / "live"
    write_live(live, 0)
    checkpointer(other, live, RecordingSink(), other.claim_generation().generation).checkpoint(0)
    savepoint = other.create_savepoint(other.handle(other.latest()))
    mine = Catalog(MemoryStorage(uuid.uuid4().hex), "job")

    with pytest.raises(RestoreError,
                       match=r"belongs to job 'other', not 'job'.*restore.allowForeignJob=true"):
        plan_restore(run_config(restore=savepoint.uri), mine, None)

    plan = plan_restore(run_config(restore=savepoint.uri, **{"restore.allowForeignJob": "true"}), mine, None)
    assert plan.snapshot is not None and plan.snapshot.metadata.job == "other" and plan.batch_id == 0


def test_restore_target_without_metadata_is_a_clear_error(tmp_path):
    with pytest.raises(RestoreError, match="has no _metadata"):
        plan_restore(run_config(restore=str(tmp_path)), Catalog(MemoryStorage(uuid.uuid4().hex), "job"), None)


def test_sink_ahead_of_the_restore_point_is_refused(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    plan = plan_restore(run_config(), catalog, None)
    sink = RecordingSink()
    sink.committed = {0: 1, 1: 1, 2: 1}
    with pytest.raises(SinkAheadError, match="already committed batch 2"):
        check_sink_position(plan, sink, "job", "fail")
    sink.committed = {0: 1}
    check_sink_position(plan, sink, "job", "fail")
    with pytest.raises(SinkAheadError):
        check_sink_position(RestorePlan(None, "empty"), sink, "job", "fail")


def test_recovery_commits_confirmed_and_aborts_the_rest(catalog, tmp_path):
    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1)
    write_live(tmp_path, 0)
    for batch in (0, 1):
        catalog.put_transaction(recording_record(batch, gen1))
        coord.transactions.add_pending(recording_record(batch, gen1))
    write_live(tmp_path, 1)
    coord.checkpoint(1)  # covers batches 0 and 1; crash before the commits
    catalog.put_transaction(recording_record(2, gen1))  # staged, never confirmed
    gen2 = catalog.claim_generation().generation
    catalog.put_transaction(recording_record(2, gen2))  # a zombie attempt from another generation
    sink = RecordingSink()
    plan = plan_restore(run_config(), catalog, None)
    pending, summary = recover_transactions(catalog, sink, plan, "checkpoint")
    assert pending == []
    assert sink.committed == {0: gen1, 1: gen1}
    assert sorted(sink.aborted) == [(2, gen1), (2, gen2)]
    assert summary["committed"] == [0, 1] and sorted(summary["aborted"]) == [2, 2]
    assert catalog.transactions() == []
    # external mode keeps confirmed transactions for the commit step
    for batch in (0, 1):
        catalog.put_transaction(recording_record(batch, gen1))
    pending, summary = recover_transactions(catalog, RecordingSink(), plan, "external")
    assert [r.batch_id for r in pending] == [0, 1]
    assert [r.batch_id for r in catalog.transactions()] == [0, 1]


def test_materialize_rebuilds_the_location_and_never_modifies_the_snapshot(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), generation)
    write_live(live, 0)
    coord.checkpoint(0)
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    before = {i.key: catalog.store.get(i.key) for i in catalog.store.list("savepoints")}
    index = materialize(savepoint, str(tmp_path / "restored"))
    assert (tmp_path / "restored" / "commits" / "0").read_text() == "c0"
    assert (tmp_path / "restored" / "state" / "0" / "0" / "1.changelog").read_text() == "s" * 1000
    assert set(index) == {f.path for f in savepoint.metadata.files}
    assert {i.key: catalog.store.get(i.key) for i in catalog.store.list("savepoints")} == before


def test_settled_transactions_are_never_committed_again(catalog, tmp_path):
    """External mode: batch 0 was published and batch 1 aborted after the checkpoint
    listed both (the commit step never aborts what the standing checkpoint lists: a
    rollback that missed the lineage did); neither the next checkpoint nor a restore may
    commit them. A restore of that checkpoint is refused: its state is past batch 1, whose
    output is gone (issue #45 item 3: it was a warning, and the batch was lost); so is
    the live run's next checkpoint, which forgets batch 0 (committed) but would have gone
    on without batch 1 (the committer's tripwire, 2026-11-30)."""
    generation = catalog.claim_generation().generation
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), generation, commit_mode="external")
    write_live(live, 0)
    write_live(live, 1)
    for batch in (0, 1):
        catalog.put_transaction(recording_record(batch, generation))
        coord.transactions.add_pending(recording_record(batch, generation))
    coord.checkpoint(1)
    published = RecordingSink()
    published.commit(recording_record(0, generation))
    # the commit step settled both
    catalog.delete_transactions([recording_record(0, generation), recording_record(1, generation)])

    sink = RecordingSink()
    sink.committed = dict(published.committed)
    with pytest.raises(SinkLineageError,
                       match=r"job-b1-g1 \(batch 1\).*was aborted since: its output is gone"):
        recover_transactions(catalog, sink, plan_restore(run_config(), catalog, None), "checkpoint")
    assert sink.committed == {0: generation}, "the aborted batch 1 was not committed"

    write_live(live, 2)
    catalog.put_transaction(recording_record(2, generation))
    coord.transactions.add_pending(recording_record(2, generation))
    coord.transactions.sink.committed = dict(published.committed)  # the one sink the run writes to
    with pytest.raises(SinkLineageError, match=r"job-b1-g1 \(batch 1\).*was aborted"):
        coord.checkpoint(2)
    assert [m.batch_id for m in catalog.checkpoints()] == [1]
    assert sorted(b for b, _g in coord.transactions.pending) == [0, 1, 2]


def test_first_checkpoint_after_a_foreign_restore_copies_into_its_own_store_without_rehashing(
    catalog, tmp_path, monkeypatch
):
    """NO_CLAIM: a restored savepoint's files are copied once into the new job's shared
    area (never referenced where they are), reusing the checksums the savepoint records."""
    generation = catalog.claim_generation().generation
    origin_live = tmp_path / "origin"
    write_live(origin_live, 0)
    checkpointer(catalog, origin_live, RecordingSink(), generation).checkpoint(0)
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    target = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    live = tmp_path / "restored"
    index = materialize(savepoint, str(live), stored=False)
    assert index and not any(entry.stored for entry in index.values())
    coord = checkpointer(target, live, RecordingSink(), target.claim_generation().generation)
    coord.seed(savepoint.metadata, index)
    coord.transactions.seed(savepoint.metadata)
    hashed: list[str] = []
    real = livedir.file_sha256
    monkeypatch.setattr(livedir, "file_sha256", lambda path: hashed.append(path) or real(path))

    first = coord.checkpoint(0)

    assert first is not None and hashed == []
    assert first.stats.files_copied == first.stats.file_count == len(savepoint.metadata.files)
    by_path = {ref.path: ref for ref in savepoint.metadata.files}
    for ref in first.files:
        assert ref.sha256 == by_path[ref.path].sha256
        assert ref.key == target.shared_key(ref.path, ref.sha256)
        assert target.store.get(ref.key) == (live / ref.path).read_bytes()
    # From then on the files are this job's own: the next checkpoint copies only what changed.
    write_live(live, 1)
    second = coord.checkpoint(1)
    assert second is not None and second.stats.files_copied == 3 and hashed


def test_recovery_stops_at_a_confirmed_transaction_that_lost_its_batch_like_the_commit_step(
    catalog, tmp_path
):
    """Issue #27.4: one conflict rule. The restart point lists batches 0 and 1 as confirmed,
    but a stalled driver of an abandoned lineage promoted batch 0 first: recovery stops
    there (as the commit step does), commits nothing after it and keeps the record."""
    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1)
    write_live(tmp_path, 1)
    for batch in (0, 1):
        catalog.put_transaction(recording_record(batch, gen1))
        coord.transactions.add_pending(recording_record(batch, gen1))
    coord.checkpoint(1)
    gen2 = catalog.claim_generation().generation
    sink = ClaimingSink()
    sink.committed[0] = gen1 + 7  # the abandoned lineage's stalled driver won batch 0

    with pytest.raises(TransactionConflict, match="batch 0 is held by transaction job-b0-g8"):
        recover_transactions(catalog, sink, plan_restore(run_config(), catalog, None), "checkpoint", gen2)

    assert sink.committed == {0: gen1 + 7}, "batch 1 must not be committed after the conflict"
    assert [r.batch_id for r in catalog.transactions()] == [0, 1]


def test_only_a_sink_that_declares_it_can_rewind_is_rewound(catalog, tmp_path):
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    plan = plan_restore(run_config(), catalog, None)
    assert plan.snapshot is not None
    ahead = {0: 1, 1: 1, 2: 1}
    plain = RecordingSink()
    plain.committed = dict(ahead)
    with pytest.raises(SinkAheadError, match="already committed batch 2"):
        check_sink_position(plan, plain, "job", "rewind")
    able = RewindingSink()
    able.committed = dict(ahead)
    assert check_sink_position(plan, able, "job", "rewind") is True
    assert able.rewound == [0]


def test_recovery_leaves_a_confirmed_record_for_another_sink_alone(catalog, tmp_path, caplog):
    """Like `settle_unconfirmed`, the commit of confirmed records skips (with a warning) a
    record of this job that names another sink kind or sink id: it is not committed
    through the job's sink, and it is left in the store."""
    gen1 = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), gen1)
    write_live(tmp_path, 0)
    write_live(tmp_path, 2)
    foreign = [dataclasses.replace(recording_record(0, gen1), sink_id="recording:other"),
               dataclasses.replace(recording_record(1, gen1), sink="delta")]
    for txn in (*foreign, recording_record(2, gen1)):
        catalog.put_transaction(txn)
        coord.transactions.add_pending(txn)
    coord.checkpoint(2)  # confirms all three; crash before the commits
    for mode in ("checkpoint", "external"):
        sink = RecordingSink()
        with caplog.at_level(logging.WARNING):
            pending, summary = recover_transactions(catalog, sink, plan_restore(run_config(), catalog, None),
                                                    mode)
        assert sink.committed == ({2: gen1} if mode == "checkpoint" else {}), mode
        assert [r.batch_id for r in pending] == ([] if mode == "checkpoint" else [2]), mode
        assert summary["committed"] == ([2] if mode == "checkpoint" else []), mode
        assert {(r.batch_id, r.sink, r.sink_id) for r in catalog.transactions()} >= {
            (r.batch_id, r.sink, r.sink_id) for r in foreign}, f"{mode}: a foreign record was removed"
        assert sum("does not match the declared sink" in m for m in caplog.messages) == 2, caplog.messages
        caplog.clear()
        catalog.put_transaction(recording_record(2, gen1))  # back for the next mode


def test_every_completed_checkpoint_lands_in_the_trend_with_its_own_figures(catalog, tmp_path):
    """The trend outlives retention (two checkpoints kept, five charted) and carries the
    figures of the checkpoint's own ``_metadata``."""
    from airflow_sparkpoint.checkpoints.counters import read_counters

    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, num_retained=2)
    completed = []
    for batch in range(5):
        write_live(tmp_path, batch)
        completed.append(coord.checkpoint(batch))
    counters = read_counters(catalog)
    assert counters is not None and len(catalog.checkpoints()) == 2
    trend = [(p.id, p.batch_id, p.completed_at, p.duration_ms, p.bytes_copied, p.bytes_total)
             for p in counters.trend]
    assert trend == [(m.id, m.batch_id, m.created_at, m.stats.duration_ms, m.stats.bytes_copied,
                      m.stats.bytes_total) for m in completed]


@pytest.mark.parametrize("policy", ["fail", "rewind"])
def test_the_sink_ahead_refusal_says_whether_the_sink_can_rewind(catalog, tmp_path, policy):
    """S3Sink and DirectorySink cannot rewind: the refusal must say so and never suggest
    restore.sinkAhead=rewind for them (with it already set, that advice is a dead end)."""
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation)
    write_live(tmp_path, 0)
    coord.checkpoint(0)
    plan = plan_restore(run_config(restore=catalog.checkpoint_uri(1), **{"restore.sinkAhead": policy}),
                        catalog, None)
    plain = RecordingSink()
    plain.committed = {0: 1, 1: 1, 2: 1}
    with pytest.raises(SinkAheadError) as info:
        check_sink_position(plan, plain, "job")
    message = str(info.value)
    assert "RecordingSink cannot rewind" in message and "DeltaSink" in message, message
    assert "sinkAhead=rewind to rewind" not in message, message
    assert "a checkpoint or savepoint at or after batch 2" in message and "new output location" in message


def test_many_transactions_pending_an_external_commit_step_are_warned_about(catalog, tmp_path, caplog):
    """commit.mode=external: every checkpoint's _metadata carries every transaction the
    commit step has not committed yet (a daily step at a batch every 3 s: ≈ 29,000). Past
    `PENDING_WARN`, the run says so (once per doubling), naming the remedy."""
    from airflow_sparkpoint.runtime import committer as committer_module

    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, commit_mode="external")
    write_live(tmp_path, 0)
    warn = committer_module.PENDING_WARN
    for batch in range(warn):
        catalog.put_transaction(recording_record(batch, generation))  # what the commit step has not settled
        coord.transactions.add_pending(recording_record(batch, generation))
    with caplog.at_level("WARNING", logger=committer_module.__name__):
        assert coord.checkpoint(warn - 1) is not None
        assert coord.checkpoint(warn - 1) is not None
    warned = [r.getMessage() for r in caplog.records if "pending" in r.getMessage()]
    assert (len(warned) == 1 and f"{warn} transactions" in warned[0]
            and "SparkpointCommitOperator" in warned[0]), warned
