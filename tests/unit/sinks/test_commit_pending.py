"""`commit_pending` / `abort_generation`: the external two-phase-commit step, driven
against an in-memory catalog and a fake sink that records what it was asked to do."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.exceptions import (
    CommitOutcomeUnknown,
    ConfigError,
    RestoreError,
    SinkError,
    StaleGeneration,
)
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.services.rollback import abort_generation
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.fake_sinks import FakeSink
from tests.support.records import checkpoint_at, transaction_record

JOB = "orders"


@pytest.fixture()
def sink_name() -> str:
    return f"w-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def world(sink_name: str) -> dict[str, Any]:
    return FakeSink(sink_name).world


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog(MemoryStorage(f"commit-{uuid.uuid4().hex[:8]}"), JOB)


def txn_ids(catalog: Catalog) -> list[str]:
    return [r.txn_id for r in catalog.transactions()]


def start_green_from_latest(catalog: Catalog) -> None:
    """Claim generation 2 and record its origin: blue's latest checkpoint (a restart)."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    base = catalog.latest()
    assert base is not None
    catalog.claim_generation()
    catalog.write_origin(new_origin(2, kind="checkpoint", uri=catalog.checkpoint_uri(base.id),
                                    base_id=base.id,
                                    snapshot_id=base.id, batch_id=base.batch_id, id_floor=base.id,
                                    restore={"restore": "x"}, live_dir=None, host="h", pid=1))


def test_no_checkpoint_leaves_everything_pending(catalog: Catalog, sink_name: str,
                                                 world: dict[str, Any]) -> None:
    catalog.put_transaction(transaction_record(FakeSink(sink_name), 0, 1, job=JOB))

    result = commit_pending(catalog)

    assert result == {"committed": [], "already": [], "aborted": [], "pending": ["orders-b0-g1"]}
    assert world["calls"] == []
    assert txn_ids(catalog) == ["orders-b0-g1"]


def test_confirmed_records_commit_in_batch_order_and_are_deleted(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    records = [transaction_record(FakeSink(sink_name), b, 1, job=JOB) for b in (2, 0, 1)]
    for r in records:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 2, generation=1, pending=list(reversed(records)))

    result = commit_pending(catalog, storage_options={"endpoint_url": "http://x"})

    assert result["committed"] == ["orders-b0-g1", "orders-b1-g1", "orders-b2-g1"]
    assert [c for c in world["calls"] if c[0] == "commit"] == [
        ("commit", "orders-b0-g1"), ("commit", "orders-b1-g1"), ("commit", "orders-b2-g1")
    ]
    assert world["configured"] == [{"endpoint_url": "http://x"}]  # one sink rebuilt, configured once
    assert txn_ids(catalog) == []


def test_second_run_is_a_no_op(catalog: Catalog, sink_name: str, world: dict[str, Any]) -> None:
    r = transaction_record(FakeSink(sink_name), 0, 1, job=JOB)
    catalog.put_transaction(r)
    checkpoint_at(catalog, 0, generation=1, pending=[r])
    assert commit_pending(catalog)["committed"] == ["orders-b0-g1"]
    calls = len(world["calls"])

    assert commit_pending(catalog) == {"committed": [], "already": [], "aborted": [], "pending": []}
    assert len(world["calls"]) == calls
    assert world["committed"] == {0: "orders-b0-g1"}


def test_landed_commit_whose_record_survived_is_repeated_idempotently_and_cleaned_up(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """The sink's own idempotent commit answers "already" (and may drop what is left
    staged, as DeltaSink does for merged rows); nothing lands twice."""
    r = transaction_record(FakeSink(sink_name), 0, 1, job=JOB)
    catalog.put_transaction(r)
    checkpoint_at(catalog, 0, generation=1, pending=[r])
    world["committed"][0] = r.txn_id  # a crash between the sink's commit and the record's deletion

    result = commit_pending(catalog)

    assert result["already"] == ["orders-b0-g1"] and result["committed"] == []
    assert world["calls"] == [("commit", r.txn_id)] and world["committed"] == {0: r.txn_id}
    assert txn_ids(catalog) == []


def test_unreferenced_records_up_to_the_checkpoint_are_aborted(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    dead = transaction_record(FakeSink(sink_name), 1, 1, job=JOB)  # generation 1 died after staging batch 1
    live = transaction_record(FakeSink(sink_name), 1, 2, job=JOB)  # generation 2 re-ran batch 1
    future = transaction_record(FakeSink(sink_name), 2, 2, job=JOB)  # staged, its checkpoint not taken yet
    for r in (dead, live, future):
        catalog.put_transaction(r)
    checkpoint_at(catalog, 1, generation=2, pending=[live])

    result = commit_pending(catalog)

    assert result == {
        "committed": ["orders-b1-g2"], "already": [], "aborted": ["orders-b1-g1"],
        "pending": ["orders-b2-g2"],
    }
    assert world["aborted"] == ["orders-b1-g1"]
    assert world["committed"] == {1: "orders-b1-g2"}
    assert txn_ids(catalog) == ["orders-b2-g2"]


def test_unreferenced_record_that_landed_is_not_aborted(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    old = transaction_record(FakeSink(sink_name), 0, 1, job=JOB)
    catalog.put_transaction(old)
    world["committed"][0] = old.txn_id  # committed in the job; record deletion was lost
    checkpoint_at(catalog, 1, generation=1, pending=[])

    result = commit_pending(catalog)

    assert result["already"] == ["orders-b0-g1"] and result["aborted"] == []
    assert world["aborted"] == []
    assert txn_ids(catalog) == []


def test_upto_batch_holds_later_confirmed_batches(catalog: Catalog, sink_name: str,
                                                  world: dict[str, Any]) -> None:
    records = [transaction_record(FakeSink(sink_name), b, 1, job=JOB) for b in range(4)]
    for r in records:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 3, generation=1, pending=records)

    result = commit_pending(catalog, upto_batch=1)
    assert result["committed"] == ["orders-b0-g1", "orders-b1-g1"]
    assert result["pending"] == ["orders-b2-g1", "orders-b3-g1"]
    assert txn_ids(catalog) == ["orders-b2-g1", "orders-b3-g1"]

    assert commit_pending(catalog)["committed"] == ["orders-b2-g1", "orders-b3-g1"]
    assert sorted(world["committed"]) == [0, 1, 2, 3]


@pytest.mark.parametrize("error", [SinkError("refused"), CommitOutcomeUnknown("timeout")])
def test_a_failed_commit_stops_later_batches_and_keeps_records(
    catalog: Catalog, sink_name: str, world: dict[str, Any], error: SinkError
) -> None:
    records = [transaction_record(FakeSink(sink_name), b, 1, job=JOB) for b in range(3)]
    for r in records:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 2, generation=1, pending=records)
    world["fail"]["orders-b1-g1"] = error

    with pytest.raises(type(error)):
        commit_pending(catalog)

    assert world["committed"] == {0: "orders-b0-g1"}
    assert txn_ids(catalog) == ["orders-b1-g1", "orders-b2-g1"]

    del world["fail"]["orders-b1-g1"]
    assert commit_pending(catalog)["committed"] == ["orders-b1-g1", "orders-b2-g1"]


def test_record_without_sink_config_is_an_error(catalog: Catalog) -> None:
    # no config
    bad = transaction_record("test-fake", 0, 1, job=JOB, sink_id="fake://x", payload={"staged": {}})
    catalog.put_transaction(bad)
    checkpoint_at(catalog, 0, generation=1, pending=[bad])

    with pytest.raises(SinkError, match="orders-b0-g1 has no sink config"):
        commit_pending(catalog)
    assert txn_ids(catalog) == ["orders-b0-g1"]


def test_unknown_sink_kind_names_the_kind(catalog: Catalog, sink_name: str) -> None:
    r = transaction_record("no-such-kind", 0, 1, job=JOB, sink_id=f"fake://{sink_name}",
                           config={"name": sink_name})
    catalog.put_transaction(r)
    checkpoint_at(catalog, 0, generation=1, pending=[r])

    with pytest.raises(ConfigError, match="'no-such-kind'"):
        commit_pending(catalog)


def test_abort_generation_discards_only_that_generations_uncommitted_records(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    blue = transaction_record(FakeSink(sink_name), 3, 1, job=JOB)
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (4, 5, 6)]
    for _ in range(2):
        catalog.claim_generation()
    for r in (blue, *green):
        catalog.put_transaction(r)
    world["committed"][4] = green[0].txn_id  # green's first batch had already gone out

    aborted = abort_generation(catalog, 2)

    assert aborted == ["orders-b5-g2", "orders-b6-g2"]
    assert world["aborted"] == ["orders-b5-g2", "orders-b6-g2"]
    # green's landed batch 4 was settled as well ("already"): its record goes, as every settler's does
    assert txn_ids(catalog) == ["orders-b3-g1"]
    assert abort_generation(catalog, 2) == []


def test_abort_generation_settles_in_batch_order_and_only_its_own_generations_records(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """The rollback settles through `settle_all`: in batch order whatever order the records
    were written in, and never a record of a newer generation (`Fence.admits`; the rollback
    of a superseded generation acts as the newest one)."""
    for _ in range(3):
        catalog.claim_generation()
    newer = transaction_record(FakeSink(sink_name), 7, 3, job=JOB)
    for r in (transaction_record(FakeSink(sink_name), 6, 2, job=JOB), newer,
              transaction_record(FakeSink(sink_name), 4, 2, job=JOB),
              transaction_record(FakeSink(sink_name), 5, 2, job=JOB)):
        catalog.put_transaction(r)

    assert abort_generation(catalog, 2) == ["orders-b4-g2", "orders-b5-g2", "orders-b6-g2"]

    assert [c for c in world["calls"] if c[0] == "abort"] == [
        ("abort", "orders-b4-g2"), ("abort", "orders-b5-g2"), ("abort", "orders-b6-g2")]
    assert txn_ids(catalog) == [newer.txn_id] and catalog.current_generation() == 3


def test_abort_generation_returns_the_lineage_to_where_the_generation_started(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """The rollback of the newest generation claims the next one (a stalled driver of
    green fails at its next act, whatever its heartbeat's age) and records green's own
    starting point as that generation's origin: green's checkpoints are superseded and
    `restore=latest` restarts where green started (issue #45: the simulation found a
    rollback of a stalled, live green whose next checkpoint confirmed an aborted batch)."""

    blue = transaction_record(FakeSink(sink_name), 3, 1, job=JOB)
    checkpoint_at(catalog, 3, generation=1, pending=[blue])
    start_green_from_latest(catalog)
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (4, 5)]
    for r in green:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 4, generation=2, pending=green[:1])
    checkpoint_at(catalog, 5, generation=2, pending=green)

    abort_generation(catalog, 2)

    assert catalog.current_generation() == 3, "the rollback fenced green by claiming the next generation"
    point = catalog.restart_point()
    assert point.checkpoint is not None and (point.checkpoint.batch_id, point.checkpoint.generation) == (3, 1)
    assert {e.metadata.batch_id: e.superseded_by for e in catalog.list_checkpoints() if e.metadata} == {
        5: 3, 4: 3, 3: None}
    with pytest.raises(StaleGeneration):
        catalog.check_generation(2)


def test_retention_keeps_where_a_rollback_of_the_newest_generation_returns(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """Checkpoint retention never removes the checkpoint a rollback of the newest
    generation returns to while that generation has recorded transactions: in external
    commit mode green's checkpoints hold only uncommitted batches, so the rollback
    returns to blue's checkpoint green started from. Found by CI: write-audit-publish's
    discard and blue-green's rollback failed with "chk-4 is not usable" once green had
    more checkpoints than `numRetained`."""
    from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention

    blue = transaction_record(FakeSink(sink_name), 3, 1, job=JOB)
    checkpoint_at(catalog, 3, generation=1, pending=[blue])
    start_green_from_latest(catalog)
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (4, 5, 6)]
    for index, r in enumerate(green):
        catalog.put_transaction(r)
        checkpoint_at(catalog, r.batch_id, generation=2, pending=green[: index + 1])
        enforce_checkpoint_retention(catalog, 1, generation=2)
    kept = sorted((m.batch_id, m.generation) for m in catalog.checkpoints())
    assert kept == [(3, 1), (6, 2)], "retention kept green's newest and the checkpoint green started from"

    abort_generation(catalog, 2)

    point = catalog.restart_point()
    assert point.checkpoint is not None and (point.checkpoint.batch_id, point.checkpoint.generation) == (3, 1)


def test_retention_keeps_a_rollback_point_of_the_newest_generation_older_than_numretained(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """Once green's batch 4 is committed (its record settled), a rollback returns to
    green's checkpoint of batch 4 (its committed output stays): retention keeps that one,
    however many newer checkpoints green has, and lets blue's go."""
    from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention

    checkpoint_at(catalog, 3, generation=1, pending=[])
    start_green_from_latest(catalog)
    checkpoint_at(catalog, 4, generation=2, pending=[])  # batch 4 committed: no record left
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (5, 6, 7)]
    for index, r in enumerate(green):
        catalog.put_transaction(r)
        checkpoint_at(catalog, r.batch_id, generation=2, pending=green[: index + 1])
        enforce_checkpoint_retention(catalog, 1, generation=2)
    assert sorted((m.batch_id, m.generation) for m in catalog.checkpoints()) == [(4, 2), (7, 2)]

    abort_generation(catalog, 2)

    point = catalog.restart_point()
    assert point.checkpoint is not None and (point.checkpoint.batch_id, point.checkpoint.generation) == (4, 2)


def test_a_rollback_whose_point_is_behind_the_generations_committed_output_is_refused(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """Found by the simulation (seed 20261129, schedule 4746): green (external commit
    mode, numRetained=1) checkpointed batches 0-3 and died; the commit step committed
    batches 0 and 1; green's checkpoints of them were gone (retention kept the newest
    only, while batch 0 was still pending). The rollback returned the lineage to where
    green started, behind its committed batch 1: every restart after it failed with
    SinkAheadError. Now it is refused after its fence, nothing aborted, no origin
    written: the job still resumes green's lineage."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    catalog.claim_generation()
    catalog.claim_generation()
    catalog.write_origin(new_origin(2, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                    id_floor=0, restore={"restore": "none"}, live_dir=None, host="h", pid=1))
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in range(4)]
    for r in green:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 3, generation=2, pending=green)  # the only checkpoint left
    sink = FakeSink(sink_name)
    for r in green[:2]:  # the commit step committed batches 0 and 1
        sink.commit(r)
    catalog.delete_transactions(green[:1])

    with pytest.raises(RestoreError, match=r"committed up to batch 1, .*empty state.*Nothing was aborted"):
        abort_generation(catalog, 2)

    assert world["aborted"] == [], "nothing aborted"
    assert catalog.current_generation() == 3, "green is fenced"
    assert [o.generation for o in catalog.origins()] == [2], "no origin behind the committed output"
    point = catalog.restart_point()
    assert point.checkpoint is not None and point.checkpoint.batch_id == 3, "restore=latest resumes green"


def test_abort_generation_of_a_store_without_lineages_retires_its_checkpoints(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    blue = transaction_record(FakeSink(sink_name), 3, 1, job=JOB)
    checkpoint_at(catalog, 3, generation=1, pending=[blue])
    catalog.claim_generation()
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (4, 5)]
    for r in green:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 4, generation=2, pending=green[:1])
    checkpoint_at(catalog, 5, generation=2, pending=green)

    abort_generation(catalog, 2)

    # green's checkpoints are gone: a later restore=latest finds blue's, not green's state
    assert [(m.batch_id, m.generation) for m in catalog.checkpoints()] == [(3, 1)]


def test_abort_generation_is_refused_while_a_newer_generation_continues_it(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    green = transaction_record(FakeSink(sink_name), 4, 2, job=JOB)
    catalog.put_transaction(green)
    checkpoint_at(catalog, 4, generation=2, pending=[green])
    catalog.claim_generation()  # generation 3 (say, a retry of green) restores green's checkpoint

    with pytest.raises(RestoreError, match="still restores its lineage: a newer run continues it"):
        abort_generation(catalog, 2)
    assert world["aborted"] == [] and txn_ids(catalog) == ["orders-b4-g2"]


def test_a_rollback_whose_claim_comes_after_a_start_that_continues_the_generation_is_refused(
    catalog: Catalog, sink_name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the long exploration (seed 20261201, schedule 1327): the rollback of
    generation 1 read it as the newest; before its claim, a retry (generation 2) restored
    generation 1's checkpoint and confirmed its transaction in a checkpoint of its own;
    the rollback's claim then took generation 3 and aborted the transaction generation
    2's checkpoint confirms: every restart after it was refused. Now the rollback claims
    exactly the generation after the one it rolls back; when a start took it, the rollback
    decides again, as for a superseded generation (refused: a newer run continues it)."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    blue = transaction_record(FakeSink(sink_name), 0, 1, job=JOB)
    catalog.put_transaction(blue)
    checkpoint_at(catalog, 0, generation=1, pending=[blue])
    retry = catalog  # the retry's own reads and writes go through the same store
    put_if_absent = catalog.store.put_if_absent
    started = []

    def a_retry_starts_first(key: str, data: bytes) -> None:
        if key.startswith("generations/") and not started:
            started.append(key)
            base = retry.latest()
            assert base is not None
            retry.claim_generation()
            retry.write_origin(new_origin(2, kind="checkpoint", uri=retry.checkpoint_uri(base.id),
                                          base_id=base.id, snapshot_id=base.id, batch_id=0, id_floor=base.id,
                                          restore={"restore": "latest"}, live_dir=None, host="h", pid=2))
            checkpoint_at(retry, 1, generation=2, pending=[blue])
        put_if_absent(key, data)

    monkeypatch.setattr(catalog.store, "put_if_absent", a_retry_starts_first)

    with pytest.raises(RestoreError, match="a newer run continues it"):
        abort_generation(catalog, 1)

    assert started, "the retry started between the rollback's read and its claim"
    assert world["aborted"] == [] and txn_ids(catalog) == ["orders-b0-g1"]
    assert catalog.current_generation() == 2, "the rollback claimed nothing: the retry runs on"


def test_a_rollback_is_refused_while_a_newer_origin_restores_the_generations_checkpoint(
    catalog: Catalog, sink_name: str, world: dict[str, Any]
) -> None:
    """Found by the long exploration (seed 20261202, schedules 998 and 2482): generation 2
    started with restore=none and wrote its origin late, after generation 3 (a retry,
    restore=latest) had restored generation 1's checkpoint. By the lineage rule that
    checkpoint is superseded (by generation 2's origin), yet it is where generation 3 and
    every retry restart. The rollback of generation 1 saw no restorable checkpoint of it,
    aborted its confirmed transaction, and every restart was refused. A checkpoint a newer
    generation's origin restored continues the generation too."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    blue = transaction_record(FakeSink(sink_name), 0, 1, job=JOB)
    catalog.put_transaction(blue)
    base = checkpoint_at(catalog, 0, generation=1, pending=[blue])
    catalog.claim_generation()  # generation 2: restore=none, its origin comes late
    catalog.claim_generation()  # generation 3: restore=latest, from generation 1's checkpoint
    catalog.write_origin(new_origin(3, kind="checkpoint", uri=catalog.checkpoint_uri(base.id),
                                    base_id=base.id, snapshot_id=base.id, batch_id=0, id_floor=base.id,
                                    restore={"restore": "latest"}, live_dir=None, host="h", pid=3))
    catalog.write_origin(new_origin(2, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                    id_floor=base.id, restore={"restore": "none"}, live_dir=None, host="h",
                                    pid=2))
    assert not any(e.restorable for e in catalog.list_checkpoints()), "superseded by generation 2's origin"

    with pytest.raises(RestoreError, match="a newer run continues it"):
        abort_generation(catalog, 1)

    assert world["aborted"] == [] and txn_ids(catalog) == ["orders-b0-g1"]


def test_a_generation_claimed_between_the_steps_reads_keeps_its_transaction(
    catalog: Catalog, sink_name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #27.2: the step read the latest checkpoint (batch 3 of generation 1); before it
    lists the records, generation 2 restores the checkpoint of batch 1 with
    ``sinkAhead=rewind``, settles generation 1's unconfirmed records and stages batch 2 in
    external mode. Batch 2 of generation 2 is at or below what the step read as latest and
    unlisted there, but it is the newer lineage's live transaction: never the step's to abort."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    base = transaction_record(FakeSink(sink_name), 1, 1, job=JOB)
    catalog.put_transaction(base)
    checkpoint_at(catalog, 1, generation=1, pending=[base])
    old = [transaction_record(FakeSink(sink_name), b, 1, job=JOB) for b in (2, 3)]
    for r in old:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 3, generation=1, pending=[base, *old])
    base_id = catalog.checkpoints()[-1].id  # the checkpoint of batch 1 (oldest last)
    newer = transaction_record(FakeSink(sink_name), 2, 2, job=JOB)
    read_point = catalog.restart_point
    interleaved = []

    def point_then_a_new_lineage() -> Any:
        point = read_point()  # what the step confirms against (`services.commit._standing`)
        if not interleaved:  # the step's first read; then generation 2 restores batch 1
            interleaved.append(point.checkpoint.batch_id if point.checkpoint else None)
            generation = catalog.claim_generation().generation
            catalog.write_origin(new_origin(
                generation, kind="checkpoint", uri=catalog.checkpoint_uri(base_id), base_id=base_id,
                snapshot_id=base_id, batch_id=1, id_floor=catalog.next_checkpoint_id() - 1,
                restore={"restore": "latest", "sink_ahead": "rewind"}, live_dir=None, host="h", pid=1))
            catalog.delete_transactions(old)  # its recovery aborted generation 1's batches 2 and 3
            catalog.put_transaction(newer)  # and it staged batch 2 again (external commit mode)
        return point

    monkeypatch.setattr(catalog, "restart_point", point_then_a_new_lineage)

    result = commit_pending(catalog)

    assert interleaved == [3]  # the new lineage came between the step's two reads
    assert newer.txn_id not in result["aborted"] and newer.txn_id not in world["aborted"]
    assert newer.txn_id in txn_ids(catalog)
    assert world["committed"].get(2) is None


def test_a_generation_claimed_before_the_step_whose_origin_comes_between_its_reads_keeps_its_transaction(
    catalog: Catalog, sink_name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #45 item 4: generation 2 is claimed *before* the step reads the fence (so the
    fence admits its records), and writes its origin, aborts generation 1's batches 2 and 3
    and stages batch 2 again right after the step's first read of the catalog. The step
    must not abort generation 2's batch 2 (the earlier fence test claimed generation 2
    after the fence was read, and passed on the broken order: the step read `latest` (now
    the restart point) first and the records after). Whichever of the two reads comes first, generation 2 acts
    right after it."""
    from airflow_sparkpoint.checkpoints.lineage import new_origin

    base = transaction_record(FakeSink(sink_name), 1, 1, job=JOB)
    catalog.put_transaction(base)
    checkpoint_at(catalog, 1, generation=1, pending=[base])
    old = [transaction_record(FakeSink(sink_name), b, 1, job=JOB) for b in (2, 3)]
    for r in old:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 3, generation=1, pending=[base, *old])
    base_id = catalog.checkpoints()[-1].id  # the checkpoint of batch 1 (oldest last)
    generation = catalog.claim_generation().generation  # claimed, its origin not yet written
    newer = transaction_record(FakeSink(sink_name), 2, generation, job=JOB)
    interleaved: list[str] = []

    def then_the_new_lineage(name: str, read: Any) -> Any:
        def first_read_then_act() -> Any:
            value = read()
            if not interleaved:
                interleaved.append(name)
                catalog.write_origin(new_origin(
                    generation, kind="checkpoint", uri=catalog.checkpoint_uri(base_id), base_id=base_id,
                    snapshot_id=base_id, batch_id=1, id_floor=catalog.next_checkpoint_id() - 1,
                    restore={"restore": "x", "sink_ahead": "rewind"}, live_dir=None, host="h", pid=1))
                catalog.delete_transactions(old)  # its recovery aborted generation 1's batches 2 and 3
                catalog.put_transaction(newer)  # and it staged batch 2 again (external commit mode)
            return value
        return first_read_then_act

    monkeypatch.setattr(catalog, "restart_point",
                        then_the_new_lineage("restart_point", catalog.restart_point))
    monkeypatch.setattr(catalog, "transactions", then_the_new_lineage("transactions", catalog.transactions))

    result = commit_pending(catalog)

    assert interleaved, "the new lineage did not come between the step's reads"
    assert newer.txn_id not in result["aborted"] and newer.txn_id not in world["aborted"], \
        (interleaved, result)
    assert newer.txn_id in txn_ids(catalog)
    assert world["committed"].get(2) is None


def test_a_rollback_stops_when_a_newer_generation_is_claimed_meanwhile(
    catalog: Catalog, sink_name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`abort_generation` is fenced like every other settler: a generation claimed after
    the rollback read the records may have restored from what the rollback is retiring."""

    from airflow_sparkpoint.checkpoints.lineage import new_origin

    for _ in range(2):
        catalog.claim_generation()
    catalog.write_origin(new_origin(2, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                    id_floor=0, restore={}, live_dir=None, host="h", pid=1))
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (4, 5)]
    for r in green:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 4, generation=2, pending=green[:1])
    read_records = catalog.transactions
    claimed = []

    def records_then_a_claim() -> Any:
        records = read_records()
        if not claimed:
            claimed.append(catalog.claim_generation().generation)
        return records

    monkeypatch.setattr(catalog, "transactions", records_then_a_claim)

    with pytest.raises(StaleGeneration, match="generation 3 of job 'orders' was superseded by generation 4"):
        abort_generation(catalog, 2)  # it fenced green as generation 3

    assert claimed == [4]
    assert world["aborted"] == [] and txn_ids(catalog) == ["orders-b4-g2", "orders-b5-g2"]
    assert [(m.batch_id, m.generation) for m in catalog.checkpoints()] == [(4, 2)]


def test_a_rollback_killed_halfway_is_retried_when_it_returned_to_the_generations_own_checkpoint(
    catalog: Catalog, sink_name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the cutover chaos trials (a rollback after a zero-downtime cutover, whose
    green has its adoption checkpoint at N before its first aborted batch): the rollback
    of green (generation 2) claimed generation 3 with green's own checkpoint of batch 4 as
    its origin, then died halfway through the aborts. Its retry took that origin, its own,
    for a newer run continuing green's lineage and refused, so green's other staged batch
    was never aborted. A retry of the rollback finishes the aborts. The fault point fires
    before the settled record is deleted (as the stop's and the commit step's do): the
    retry aborts batch 5 again (a decided abort stands) and deletes its record."""
    from airflow_sparkpoint import faults

    class Killed(BaseException):
        pass

    checkpoint_at(catalog, 3, generation=1, pending=[])
    start_green_from_latest(catalog)
    checkpoint_at(catalog, 4, generation=2, pending=[])  # green's own checkpoint before its staged batches
    green = [transaction_record(FakeSink(sink_name), b, 2, job=JOB) for b in (5, 6)]
    for index, r in enumerate(green):
        catalog.put_transaction(r)
        checkpoint_at(catalog, r.batch_id, generation=2, pending=green[: index + 1])

    def killed(point: str, batch: int, done: int, total: int) -> None:
        if point == "abort" and done == 1:
            raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(faults, "maybe_kill_halfway", killed)
        with pytest.raises(Killed):
            abort_generation(catalog, 2)
    assert [r.batch_id for r in catalog.transactions()] == [5, 6], \
        "killed after the first abort, before its deletion"
    assert world["aborted"] == [green[0].txn_id]
    assert catalog.current_generation() == 3

    assert abort_generation(catalog, 2) == [green[0].txn_id, green[1].txn_id]
    assert world["aborted"] == [green[0].txn_id, *(r.txn_id for r in green)] and world["committed"] == {}

    assert catalog.transactions() == []
    assert catalog.current_generation() == 3, "the retry claims nothing more"
    point = catalog.restart_point()
    assert point.checkpoint is not None and (point.checkpoint.batch_id, point.checkpoint.generation) == (4, 2)
    # a start since (generation 4, from the rollback's point) continues green's lineage: refused then
    catalog.claim_generation()
    with pytest.raises(RestoreError):
        abort_generation(catalog, 2)
