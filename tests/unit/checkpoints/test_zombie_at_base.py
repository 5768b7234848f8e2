"""A fenced writer's late checkpoint that lands on an id retention freed, at or below the
base a newer lineage names (found in review of 4c4e375; each test failed on that code)."""

from __future__ import annotations

import uuid

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.fake_sinks import RecordingLineageSink
from tests.support.records import put_checkpoint, transaction_record


def _start(catalog: Catalog, *, kind: str, base: int, uri: str | None, batch: int | None) -> int:
    generation = catalog.claim_generation().generation
    catalog.write_origin(new_origin(
        generation, kind=kind, uri=uri, base_id=base, snapshot_id=base if base >= 0 else None, batch_id=batch,
        id_floor=catalog.next_checkpoint_id() - 1, restore={}, live_dir=None, host="h", pid=1))
    return generation


def _state(batch: int, who: str) -> dict[str, bytes]:
    return {f"commits/{batch}": f"c{batch}".encode(), "state": f"{who} after {batch}".encode()}


def test_a_zombie_checkpoint_on_a_savepoint_lineages_base_id_is_not_the_commit_steps_latest() -> None:
    """The window. Generation 1 (Z) checkpoints batches 0..2 (chk-1..3), uploads its files
    of batch 3 and stalls between its last fence check and its ``_metadata``
    ``put_if_absent`` of chk-4. Generation 2 (P) restores chk-3 and, in external commit
    mode, checkpoints batch 3 as chk-4 (pending: P's transaction of batch 3) and batch 4
    as chk-5; a savepoint S is copied from chk-4. Generation 3 (Q) restores chk-5,
    checkpoints chk-6 and chk-7, and its retention (numRetained=2) deletes chk-1..5
    (ids are not tombstoned) and prunes origins 1 and 2 (they supersede nothing left).
    Z wakes up: ``put_if_absent(chk-4/_metadata)`` succeeds, and its files are still
    there (younger than the grace period): a *valid* checkpoint of generation 1. No
    origin supersedes it any more (origin 2 is pruned; Q's base is 5 > 4). Generation 4
    (N) restores S by path: its origin is a savepoint with ``base_id`` 4 (S's source
    checkpoint), so chk-4 (id 4, not > 4) is not superseded by N either, while chk-6
    and chk-7 are. N's recovery keeps S's pending transaction (3, P) for the commit
    step (external mode). ``restore=latest`` answers S, but ``LineageView.latest()``
    (the commit step's) answers Z's abandoned chk-4: the commit step aborts (3, P),
    which N's restart point confirms: batch 3's output is lost (and every later commit
    step stops at it: "was aborted").
    """
    from airflow_sparkpoint.services import commit as commit_module

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    mem = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    zombie = _start(mem, kind="empty", base=-1, uri=None, batch=None)
    for batch in range(3):
        put_checkpoint(mem, _state(batch, "z"), batch_id=batch)
    late = put_checkpoint(mem, _state(3, "z"), batch_id=3)  # Z's chk-4: files uploaded...
    late_bytes = mem.store.get(layout.checkpoint_metadata(late.id))
    mem.store.delete([layout.checkpoint_metadata(late.id)])  # ...its _metadata not yet written

    second = _start(mem, kind="checkpoint", base=3, uri=mem.checkpoint_uri(3), batch=2)
    mem.put_transaction(transaction_record(RecordingLineageSink(), 3, second))
    four = put_checkpoint(mem, _state(3, "p"), batch_id=3,
                          pending=[transaction_record(RecordingLineageSink(), 3, second)])
    assert four.id == late.id == 4
    savepoint = mem.create_savepoint(mem.handle(four))
    mem.put_transaction(transaction_record(RecordingLineageSink(), 4, second))
    put_checkpoint(mem, _state(4, "p"), batch_id=4,
                   pending=[transaction_record(RecordingLineageSink(), 3, second),
                            transaction_record(RecordingLineageSink(), 4, second)])

    third = _start(mem, kind="checkpoint", base=5, uri=mem.checkpoint_uri(5), batch=4)
    put_checkpoint(mem, _state(5, "q"), batch_id=5,
                   pending=[transaction_record(RecordingLineageSink(), 3, second),
                            transaction_record(RecordingLineageSink(), 4, second)])
    put_checkpoint(mem, _state(6, "q"), batch_id=6,
                   pending=[transaction_record(RecordingLineageSink(), 3, second),
                            transaction_record(RecordingLineageSink(), 4, second)])
    mem.delete_transactions([r for r in mem.transactions() if r.generation == third])
    enforce_checkpoint_retention(mem, 2, grace_seconds=600, generation=third)
    assert [e.id for e in mem.list_checkpoints()] == [7, 6]
    assert [o.generation for o in mem.origins()] == [third], "origins 1 and 2 supersede nothing left"

    mem.store.put_if_absent(layout.checkpoint_metadata(late.id), late_bytes)  # Z's late write lands
    assert mem.snapshot(late.id).metadata.generation == zombie, "valid: its files are still there"

    newest = _start(mem, kind="savepoint", base=four.id, uri=savepoint.uri, batch=3)
    # N's recovery: what S does not confirm is aborted, S's pending (3, P) kept (external mode).
    mem.delete_transactions([r for r in mem.transactions() if (r.batch_id, r.generation) != (3, second)])
    point = mem.restart_point()
    assert point.uri == savepoint.uri and point.origin is not None and point.origin.generation == newest

    latest = mem.latest()
    commit_module.commit_pending(mem, storage_options={})
    assert RecordingLineageSink.aborted == [], (
        f"the commit step read generation {latest and latest.generation}'s chk-{latest and latest.id} as "
        f"latest (abandoned by generation 2's lineage) and aborted {RecordingLineageSink.aborted}, which "
        f"generation {newest}'s restart point {savepoint.uri} confirms")


def test_a_zombie_checkpoint_on_a_pinned_lineages_freed_base_is_not_its_restart_point() -> None:
    """The same late write against ``restore=latest`` itself. Z (generation 1) stalls
    before its ``_metadata`` of chk-4; P (2) restores chk-3 and checkpoints chk-4 and
    chk-5; Q (3) restores chk-5, checkpoints chk-6, and its retention prunes origins 1
    and 2 (they supersede nothing left). N (4) restores chk-4 by path: it pins a copy
    (``pins/4``) and its origin names base 4. Q's retention pass, decided before N's
    claim (a stale deleter, the reason pins exist), deletes chk-4. Z's ``put_if_absent``
    of chk-4 lands, its files still there: a valid checkpoint of generation 1 that no
    origin supersedes (its id is not above N's base, origin 2 is gone). N dies before
    its first checkpoint. ``restore=latest`` must restart from N's pin (P's state at
    batch 3); `resolve_restart_point` reads the entry at ``base_id`` without asking
    whether it is the checkpoint N restored, and answers Z's abandoned state instead
    (the sink check then refuses it, Z's batch 3 having been aborted by P's start: the
    job cannot resume without a person, although its pin is intact).
    """
    mem = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    zombie = _start(mem, kind="empty", base=-1, uri=None, batch=None)
    for batch in range(3):
        put_checkpoint(mem, _state(batch, "z"), batch_id=batch)
    late = put_checkpoint(mem, _state(3, "z"), batch_id=3)
    late_bytes = mem.store.get(layout.checkpoint_metadata(late.id))
    mem.store.delete([layout.checkpoint_metadata(late.id)])  # Z stalls before its _metadata

    _start(mem, kind="checkpoint", base=3, uri=mem.checkpoint_uri(3), batch=2)
    four = put_checkpoint(mem, _state(3, "p"), batch_id=3)
    put_checkpoint(mem, _state(4, "p"), batch_id=4)
    third = _start(mem, kind="checkpoint", base=5, uri=mem.checkpoint_uri(5), batch=4)
    put_checkpoint(mem, _state(5, "q"), batch_id=5)
    enforce_checkpoint_retention(mem, 3, grace_seconds=600, generation=third)
    assert [e.id for e in mem.list_checkpoints()] == [6, 5, 4]
    assert [o.generation for o in mem.origins()] == [third]

    generation = mem.claim_generation().generation  # N restores chk-4 by path: pin, then origin
    pin = mem.create_savepoint(mem.handle(four), key=layout.pin_dir(generation))
    mem.write_origin(new_origin(
        generation, kind="checkpoint", uri=mem.checkpoint_uri(four.id), base_id=four.id, snapshot_id=four.id,
        batch_id=3, id_floor=mem.next_checkpoint_id() - 1, restore={}, live_dir=None, host="h", pid=1,
        pin=pin.uri, base_generation=four.generation))  # as the runtime writes it (`run_startup`)
    mem.store.delete_prefix(layout.checkpoint_dir(four.id))  # Q's stale retention pass
    mem.store.put_if_absent(layout.checkpoint_metadata(late.id), late_bytes)  # Z's late write lands
    assert mem.snapshot(late.id).metadata.generation == zombie

    point = mem.restart_point()
    chosen = point.checkpoint
    assert chosen is None or chosen.generation != zombie, (
        f"restore=latest restarts from generation {zombie}'s chk-{chosen.id} (batch {chosen.batch_id}), a "
        f"lineage abandoned by generation 2, instead of {pin.uri}, the copy of what generation "
        f"{generation} restored")


def test_a_rollback_to_empty_state_does_not_inherit_the_rolled_back_generations_id_floor() -> None:
    """`services.rollback._restart_before` writes the rolled-back generation's own origin
    again for the rollback's claim (``replace(own, ...)``), keeping its ``id_floor``: the
    ids in use when *that* generation planned. For an empty-state origin the floor is what
    `resolve_restart_point` uses to tell the lineage's own damaged checkpoints from older
    ones, so every checkpoint the rolled-back generation wrote counts as the new lineage's
    own. One of them with an unreadable ``_metadata`` (no ``written_by``: the 4c4e375 rule
    cannot pass over it) makes every ``restore=latest`` refuse ("started from empty state
    and its checkpoints are damaged"), although the rollback abandoned those checkpoints
    and returned the job to empty state. Not a loss: a false refusal (the job waits for a
    person).
    """
    from airflow_sparkpoint.services.rollback import abort_generation

    RecordingLineageSink.committed_log.clear()
    RecordingLineageSink.aborted.clear()
    mem = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    first = _start(mem, kind="empty", base=-1, uri=None, batch=None)
    mem.put_transaction(transaction_record(RecordingLineageSink(), 0, first))
    put_checkpoint(mem, _state(0, "a"), batch_id=0,
                   pending=[transaction_record(RecordingLineageSink(), 0, first)])
    broken = put_checkpoint(mem, _state(1, "a"), batch_id=1,
                            pending=[transaction_record(RecordingLineageSink(), 0, first)])
    key = layout.checkpoint_metadata(broken.id)
    body = mem.store.get(key)
    mem.store.delete([key])
    mem.store.put(key, body[:-7])  # unreadable _metadata (truncated)

    abort_generation(mem, first, storage_options={})
    newest = mem.origins()[-1]
    assert newest.kind == "empty" and newest.restore.get("rollback_of") == first
    assert RecordingLineageSink.aborted == [(0, first)]
    point = mem.restart_point()  # refused: generation 1's chk-2 is taken for the new lineage's own
    assert point.empty and point.origin is not None and point.origin.generation == newest.generation
