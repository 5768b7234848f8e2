"""Lineages (invariant 9): origin records, the superseded rule, `restart_point`,
lineage-aware `latest()` and retention, on an in-memory catalog."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.lineage import Origin, new_origin, superseded_by
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.retention import deleted_since, enforce_checkpoint_retention
from airflow_sparkpoint.exceptions import ObjectExists, RestoreError, StaleGeneration
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.fake_sinks import RecordingLineageSink
from tests.support.records import transaction_record

MakeCheckpoint = Callable[..., SnapshotMetadata]


@pytest.fixture()
def mem() -> Catalog:
    return Catalog(MemoryStorage(uuid.uuid4().hex), "job")


def start(catalog: Catalog, *, kind: str = "checkpoint", base: int = -1, uri: str | None = None,
          batch: int | None = None, **restore: Any) -> int:
    """Claim a generation and record its origin, as the runtime does."""
    generation = catalog.claim_generation().generation
    catalog.write_origin(new_origin(
        generation, kind=kind, uri=uri if uri is not None
        else (catalog.checkpoint_uri(base) if base >= 0 else None),
        base_id=base, snapshot_id=base if base >= 0 else None, batch_id=batch,
        id_floor=catalog.next_checkpoint_id() - 1, restore=restore, live_dir=None, host="h", pid=1,
    ))
    return generation


def chk(make: MakeCheckpoint, catalog: Catalog, batch: int, **kw: Any) -> SnapshotMetadata:
    """A checkpoint of the current generation at `batch` (one file per batch plus one shared file)."""
    return make(catalog, {f"commits/{batch}": f"c{batch}".encode(), "metadata": b"query"}, batch_id=batch,
                **kw)


def test_the_rule() -> None:
    origins = [Origin(1, "empty", None, -1), Origin(2, "checkpoint", "x", 5), Origin(4, "checkpoint", "x", 3)]
    assert superseded_by(1, 3, origins) is None  # every later lineage started at or after it
    assert superseded_by(1, 5, origins) == 4  # restored by generation 2, abandoned by 4 (back to 3)
    assert superseded_by(1, 6, origins) == 2  # newer than generation 2's base: the smallest wins
    assert superseded_by(2, 7, origins) == 4
    assert superseded_by(4, 9, origins) is None  # the newest lineage is never superseded
    assert superseded_by(3, 2, origins) is None


def test_origin_is_written_once_and_round_trips(mem: Catalog) -> None:
    generation = start(mem, kind="empty", sink_ahead="fail")
    (origin,) = mem.origins()
    assert origin.generation == generation and origin.kind == "empty" and origin.base_id == -1
    assert origin.restore == {"sink_ahead": "fail"}
    with pytest.raises(ObjectExists):
        mem.write_origin(origin)
    assert Origin.from_json(origin.to_json()) == origin


def test_a_normal_chain_of_restarts_supersedes_nothing(mem: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    start(mem, kind="empty")
    for batch in range(3):
        chk(make_checkpoint, mem, batch)
    start(mem, base=mem.latest().id)
    newest = chk(make_checkpoint, mem, 3)
    assert [e.superseded_by for e in mem.list_checkpoints()] == [None] * 4
    assert mem.latest() == newest
    assert mem.restart_point().checkpoint == newest


def test_restoring_an_older_checkpoint_supersedes_the_newer_ones(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(4)]
    rewinder = start(mem, base=metas[1].id, batch=1, sink_ahead="rewind")  # then killed before a checkpoint
    entries = {e.id: e for e in mem.list_checkpoints()}
    assert [entries[m.id].superseded_by for m in metas] == [None, None, rewinder, rewinder]
    assert entries[metas[3].id].valid and not entries[metas[3].id].restorable
    assert mem.latest() == metas[1], "the abandoned lineage's newer checkpoints are never latest"
    point = mem.restart_point()
    assert point.checkpoint == metas[1] and point.origin is not None and point.origin.generation == rewinder
    # The retry continues that lineage; its checkpoints win from then on.
    start(mem, base=metas[1].id, batch=1)
    mine = chk(make_checkpoint, mem, 2)
    assert (mem.latest() == mine and mem.restart_point().checkpoint == mine
            and mem.restart_point().origin is None)


def test_a_zombie_checkpoint_completed_after_a_newer_generation_started_is_superseded(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    first = chk(make_checkpoint, mem, 0)
    zombie = mem.current_generation()
    newer = start(mem, base=first.id, batch=0)
    # The zombie checked its generation before the claim and writes _metadata after it.
    late = first.with_(id=mem.next_checkpoint_id(), batch_id=1, generation=zombie)
    mem.store.put_if_absent(layout.checkpoint_metadata(late.id), late.to_bytes())
    assert mem.snapshot(late.id).metadata == late, "a valid checkpoint"
    assert superseded_by(late.generation, late.id, mem.origins()) == newer
    assert mem.latest() == first and mem.restart_point().checkpoint == first


def test_a_zombies_damaged_checkpoint_is_superseded_not_the_new_lineages_damage(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    """A fenced writer's late ``_metadata`` whose files were collected (an id retention
    freed) is not a damaged checkpoint of the lineage that abandoned it (20269941:2016)."""
    start(mem, kind="empty")
    zombie = mem.current_generation()
    late = chk(make_checkpoint, mem, 0)
    mem.store.delete([layout.checkpoint_metadata(late.id)])  # not written yet: the zombie stalls
    newer = start(mem, kind="empty")
    shared = next(ref.key for ref in late.files if ref.path == "metadata")
    mem.store.delete([shared])  # the newer lineage's clean-up collected the zombie's upload
    mem.store.put_if_absent(layout.checkpoint_metadata(late.id), late.to_bytes())
    entry = next(e for e in mem.list_checkpoints() if e.id == late.id)
    assert entry.metadata is None and entry.written_by == zombie and shared in str(entry.error)
    point = mem.restart_point()
    assert point.empty and point.origin is not None and point.origin.generation == newer
    # The newest lineage's own damaged checkpoint still refuses the start.
    own = chk(make_checkpoint, mem, 0)
    mem.store.delete([next(ref.key for ref in own.files if ref.path == "commits/0")])
    with pytest.raises(RestoreError, match="started from empty state and its checkpoints are damaged"):
        mem.restart_point()


def test_complete_checkpoint_rechecks_the_generation_after_writing(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    first = chk(make_checkpoint, mem, 0)
    original = mem.store.put_if_absent

    def claim_meanwhile(key: str, data: bytes) -> None:
        original(key, data)
        if key.endswith(layout.METADATA):
            mem.store.put_if_absent = original  # type: ignore[method-assign]
            start(mem, base=first.id, batch=0)

    mem.store.put_if_absent = claim_meanwhile  # type: ignore[method-assign]
    with pytest.raises(StaleGeneration):
        chk(make_checkpoint, mem, 1)
    assert mem.latest() == first


def test_restore_none_with_force_supersedes_everything(mem: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    start(mem, kind="empty")
    chk(make_checkpoint, mem, 0)
    generation = start(mem, kind="empty", force=True)
    assert mem.latest() is None
    point = mem.restart_point()
    assert point.empty and point.origin is not None and point.origin.generation == generation
    assert all(e.superseded_by == generation for e in mem.list_checkpoints())


def test_a_lineage_started_from_a_savepoint_falls_back_to_the_savepoint(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(3)]
    savepoint = mem.create_savepoint(mem.handle(metas[0]))
    start(mem, kind="savepoint", base=metas[0].id, uri=savepoint.uri, batch=0)
    point = mem.restart_point()
    assert point.checkpoint is None and point.uri == savepoint.uri
    assert mem.latest() == metas[0], "the savepoint's source is still on the lineage"
    assert [e.superseded_by is not None for e in mem.list_checkpoints()] == [True, True, False]


def test_stores_without_origins_resume_from_the_newest_valid_checkpoint(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    mem.claim_generation()
    metas = [chk(make_checkpoint, mem, batch) for batch in range(2)]
    mem.store.put(layout.checkpoint_metadata(metas[1].id), b"garbage")
    point = mem.restart_point()
    assert (point.checkpoint == metas[0] and point.skipped
            and point.skipped[0][0] == mem.checkpoint_uri(metas[1].id))


def test_damaged_checkpoints_and_nothing_restorable_is_an_error_never_empty_state(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(2)]
    shared = next(ref.key for ref in metas[0].files if ref.path == "metadata")
    mem.store.delete([shared])  # every checkpoint references it
    with pytest.raises(RestoreError) as info:
        mem.restart_point()
    text = str(info.value)
    for meta in metas:
        assert mem.checkpoint_uri(meta.id) in text
    assert shared in text and "sparkpoint list" in text and "restore.force=true" in text
    # Incomplete directories only (a first checkpoint that never completed): empty state.
    other = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    start(other, kind="empty")
    other.store.put("chk-1/shared-file-in-progress", b"x")
    assert other.restart_point().empty


def test_a_damaged_origin_falls_back_to_an_older_checkpoint_of_its_lineage(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(4)]
    start(mem, base=metas[2].id, batch=2)
    mem.store.put(layout.checkpoint_metadata(metas[2].id), b"{}")
    assert mem.restart_point().checkpoint == metas[1]
    for meta in metas[:2]:
        mem.store.put(layout.checkpoint_metadata(meta.id), b"{}")
    with pytest.raises(RestoreError, match="where the lineage of generation 2 started"):
        mem.restart_point()


def test_retention_keeps_restorable_deletes_superseded_and_prunes_origins(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(4)]
    start(mem, base=metas[0].id, batch=0)
    # Before the new lineage has a checkpoint, its origin is protected even past numRetained.
    enforce_checkpoint_retention(mem, 1)
    assert {e.id for e in mem.list_checkpoints()} == {metas[0].id}
    again = chk(make_checkpoint, mem, 1)
    result = enforce_checkpoint_retention(mem, 1)
    assert result.deleted_checkpoints == (metas[0].id,)
    assert [e.id for e in mem.list_checkpoints()] == [again.id]
    assert [o.generation for o in mem.origins()] == [mem.current_generation()], "stale origins are pruned"


def test_retention_is_fenced_and_journals_before_deleting(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    generation = start(mem, kind="empty")
    for batch in range(3):
        chk(make_checkpoint, mem, batch)
    mem.store.put("shared/orphan~00", b"left by an abandoned checkpoint")
    start(mem, base=mem.latest().id)
    before = {i.key for i in mem.store.list("")}
    with pytest.raises(StaleGeneration):
        enforce_checkpoint_retention(mem, 1, generation=generation)
    assert {i.key for i in mem.store.list("")} == before, "a superseded generation deleted something"
    since = time.time() - 1
    result = enforce_checkpoint_retention(mem, 1, generation=mem.current_generation())
    assert result.deleted_files >= 1 and "shared/orphan~00" in deleted_since(mem, since)


def test_orphans_younger_than_the_grace_period_survive(mem: Catalog, make_checkpoint: MakeCheckpoint) -> None:
    start(mem, kind="empty")
    chk(make_checkpoint, mem, 0)
    mem.store.put("shared/being-uploaded~00", b"a newer generation's checkpoint in progress")
    assert enforce_checkpoint_retention(mem, 1, grace_seconds=600).deleted_files == 0
    assert mem.store.exists("shared/being-uploaded~00")


def test_external_commit_step_never_aborts_the_new_lineage(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    """Issue #15 hole 2 in commit.mode=external: generation 1 checkpointed batches 0..3
    (all pending for the commit step); generation 2 restored batch 1 with a rewind and
    staged batches 2 and 3 again before dying. The commit step must commit what batch 1's
    checkpoint confirmed and leave generation 2's records pending (the next start settles
    them), not abort them as "unlisted and at or below the latest checkpoint"."""
    from airflow_sparkpoint.services import commit as commit_module

    sink = RecordingLineageSink
    sink.committed_log.clear()
    sink.aborted.clear()
    gen1 = start(mem, kind="empty")
    metas = []
    for batch in range(4):
        mem.put_transaction(transaction_record(sink(), batch, gen1))
        meta = chk(make_checkpoint, mem, batch)
        meta = meta.with_(transactions=tuple(transaction_record(sink(), b, gen1) for b in range(batch + 1)))
        mem.store.put(layout.checkpoint_metadata(meta.id), meta.to_bytes())
        metas.append(meta)
    gen2 = start(mem, base=metas[1].id, batch=1, sink_ahead="rewind")
    for batch in (2, 3):
        mem.put_transaction(transaction_record(sink(), batch, gen2))

    result = commit_module.commit_pending(mem, storage_options={})

    assert sorted(sink.committed_log) == [(0, gen1), (1, gen1)]
    assert sink.aborted == []
    assert ({(r.batch_id, r.generation) for r in mem.transactions()}
            == {(2, gen1), (3, gen1), (2, gen2), (3, gen2)})
    assert sorted(result["pending"]) == sorted(r.txn_id for r in mem.transactions())


def test_a_lineage_whose_base_is_gone_restarts_from_its_pin_and_the_pin_goes_with_its_origin(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    """Issue #27.3: a restore by path owns a copy of its base (`Origin.pin`)."""
    start(mem, kind="empty")
    metas = [chk(make_checkpoint, mem, batch) for batch in range(3)]
    generation = mem.claim_generation().generation
    pin = mem.create_savepoint(mem.handle(metas[0]), key=layout.pin_dir(generation))
    mem.write_origin(new_origin(
        generation, kind="checkpoint", uri=mem.checkpoint_uri(metas[0].id), base_id=metas[0].id,
        snapshot_id=metas[0].id, batch_id=0, id_floor=mem.next_checkpoint_id() - 1, restore={}, live_dir=None,
        host="h", pid=1, pin=pin.uri,
    ))
    assert mem.restart_point().checkpoint == metas[0], "while its base is there, the base"
    mem.store.delete_prefix(layout.checkpoint_dir(metas[0].id))  # a stale retention pass
    point = mem.restart_point()
    assert point.checkpoint is None and point.uri == pin.uri and point.origin is not None
    assert point.origin.generation == generation

    own = chk(make_checkpoint, mem, 1)
    start(mem, base=own.id, batch=1)  # a newer lineage from the pinned lineage's checkpoint
    enforce_checkpoint_retention(mem, 1)
    assert generation not in [o.generation for o in mem.origins()]
    assert list(mem.store.list(layout.pin_dir(generation))) == [], "the pin went with its origin"


def test_a_pin_a_newer_lineage_restarts_from_stays_when_its_origin_is_pruned(
    mem: Catalog, make_checkpoint: MakeCheckpoint
) -> None:
    """Issue #45 item 6: generation 2 restored a checkpoint by path (its pin) and died
    before its first checkpoint; its base went (a stale retention pass), so generation 3's
    `restore=latest` restarted from generation 2's pin (its origin's URI), and it died
    before its first checkpoint too. A retention pass then pruned generation 2's origin
    (it supersedes none of the checkpoints left) and deleted its pin: generation 3's
    lineage had lost its starting point."""
    start(mem, kind="empty")
    early = chk(make_checkpoint, mem, 0)  # older than every base below: kept, so retention prunes
    metas = [chk(make_checkpoint, mem, batch) for batch in range(1, 4)]
    second = mem.claim_generation().generation
    pin = mem.create_savepoint(mem.handle(metas[0]), key=layout.pin_dir(second))
    mem.write_origin(new_origin(
        second, kind="checkpoint", uri=mem.checkpoint_uri(metas[0].id), base_id=metas[0].id,
        snapshot_id=metas[0].id, batch_id=0, id_floor=mem.next_checkpoint_id() - 1, restore={}, live_dir=None,
        host="h", pid=1, pin=pin.uri,
    ))
    mem.store.delete_prefix(layout.checkpoint_dir(metas[0].id))
    third = start(mem, kind="savepoint", uri=pin.uri, base=metas[0].id, batch=1)
    assert mem.restart_point().uri == pin.uri
    for meta in metas[1:]:  # generation 2's origin now supersedes none of the checkpoints left
        mem.store.delete_prefix(layout.checkpoint_dir(meta.id))

    enforce_checkpoint_retention(mem, 1)
    assert [e.id for e in mem.list_checkpoints()] == [early.id]

    assert second not in [o.generation for o in mem.origins()], \
        "generation 2's origin supersedes nothing: pruned"
    point = mem.restart_point()
    assert point.origin is not None and point.origin.generation == third
    assert mem.store.exists(f"{layout.pin_dir(second)}/{layout.METADATA}"), (
        "generation 3 restarts from generation 2's pin: it must stay")


@pytest.mark.parametrize("stall", ["long", "superseded"])
def test_retention_deletes_journaled_files_only_right_after_the_journal_and_fenced(
    mem: Catalog, make_checkpoint: MakeCheckpoint, monkeypatch: pytest.MonkeyPatch, stall: str
) -> None:
    """Issue #45 item 6: a checkpoint being completed reads the deletion journal 60 s back
    from its listing of ``shared/``; a retention pass that stalled longer between its
    journal entry and its deletion (or was superseded meanwhile) deleted a file that a
    newer checkpoint, completed in the stall, referenced. Now the pass deletes only within
    `JOURNAL_DELETE_WITHIN_S` of its entry, and after a fence check."""
    from airflow_sparkpoint.checkpoints import retention

    generation = start(mem, kind="empty")
    chk(make_checkpoint, mem, 0)
    mem.store.put("shared/orphan~00", b"left by an abandoned checkpoint")
    clock = [1000.0]
    monkeypatch.setattr(retention.time, "monotonic", lambda: clock[0])
    journal = retention.journal_deletions

    def journal_then_stall(*args: Any, **kwargs: Any) -> None:
        journal(*args, **kwargs)
        if stall == "long":
            clock[0] += 61  # a GC pause, a partition
        else:
            mem.claim_generation()  # a newer generation started meanwhile

    monkeypatch.setattr(retention, "journal_deletions", journal_then_stall)
    if stall == "long":
        enforce_checkpoint_retention(mem, 1, generation=generation)
    else:
        with pytest.raises(StaleGeneration):
            enforce_checkpoint_retention(mem, 1, generation=generation)
    assert mem.store.exists("shared/orphan~00"), \
        "a pass that stalled after its journal entry deleted the file"
