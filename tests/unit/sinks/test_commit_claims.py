"""The external commit step (`commit_pending`, `abort_generation`) against a real
`DirectorySink` on a local directory (batches staged by hand, as Spark's writer leaves
them under ``_staging/<txn>``): it follows the batches' claims — a record holding its
batch's claim is finished, one whose batch another transaction holds is aborted with its
own data only, and a confirmed record that lost is a conflict that stops the step."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.exceptions import TransactionConflict
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.services.rollback import abort_generation
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.deaths import Died, kill_at
from tests.support.records import checkpoint_at
from tests.support.sink_files import sink_dir, staged_transaction, visible_rows

JOB = "orders"


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog(MemoryStorage(f"commit-claims-{uuid.uuid4().hex[:8]}"), JOB)


@pytest.fixture()
def sink(tmp_path: Path) -> DirectorySink:
    return DirectorySink(str(tmp_path / "out"), "json")


#: a batch staged by hand, three files of it
staged = functools.partial(staged_transaction, job=JOB, files=3)


def leftovers(sink: DirectorySink) -> list[str]:
    staging = sink_dir(sink) / "_staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_a_record_whose_batch_another_transaction_holds_is_aborted_with_its_own_data_only(
    catalog: Catalog, sink: DirectorySink
) -> None:
    zombie, rerun = staged(sink, 1, 1), staged(sink, 1, 2)
    catalog.put_transaction(zombie)
    sink.commit(rerun)  # the newer generation promoted batch 1 first
    checkpoint_at(catalog, 1, generation=2, pending=[])

    result = commit_pending(catalog)

    assert result["aborted"] == [zombie.txn_id] and result["committed"] == []
    assert {r["txn"] for r in visible_rows(sink)} == {rerun.txn_id} and len(visible_rows(sink)) == 3
    assert leftovers(sink) == [] and catalog.transactions() == []


def test_an_unfinished_claim_is_finished_by_the_step_never_aborted(
    catalog: Catalog, sink: DirectorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = staged(sink, 2, 1)
    catalog.put_transaction(record)
    with monkeypatch.context() as patch:
        kill_at(patch, "promoting")
        with pytest.raises(Died):
            sink.commit(record)  # one file of three moved, the claim not done
    assert len(visible_rows(sink)) == 1
    # a newer generation's checkpoint that does not list it
    checkpoint_at(catalog, 3, generation=2, pending=[])

    result = commit_pending(catalog)

    assert result["already"] == [record.txn_id] and result["aborted"] == []
    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [200, 201, 202] and leftovers(sink) == []


def test_a_confirmed_record_that_lost_its_batch_stops_the_step(catalog: Catalog, sink: DirectorySink) -> None:
    mine = [staged(sink, b, 2) for b in (4, 5)]
    for r in mine:
        catalog.put_transaction(r)
    checkpoint_at(catalog, 5, generation=2, pending=mine)
    winner = staged(sink, 4, 1)  # a stalled driver of the abandoned lineage promoted batch 4 first
    sink.commit(winner)

    with pytest.raises(TransactionConflict, match=f"by transaction {winner.txn_id!r}"):
        commit_pending(catalog)

    assert {r["txn"] for r in visible_rows(sink)} == {winner.txn_id}, \
        "batch 5 must not be committed after the conflict"
    assert [r.txn_id for r in catalog.transactions()] == [r.txn_id for r in mine]
    assert leftovers(sink) == [mine[1].txn_id], "the loser's staged data is discarded, batch 5's is kept"


def test_abort_generation_finishes_what_a_generation_claimed_and_aborts_the_rest(
    catalog: Catalog, sink: DirectorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    claimed, pending = staged(sink, 6, 3), staged(sink, 7, 3)
    for _ in range(3):
        catalog.claim_generation()
    for r in (claimed, pending):
        catalog.put_transaction(r)
    with monkeypatch.context() as patch:
        kill_at(patch, "promoting")
        with pytest.raises(Died):
            sink.commit(claimed)

    assert abort_generation(catalog, 3) == [pending.txn_id]

    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [600, 601, 602]
    assert leftovers(sink) == []
    assert catalog.transactions() == [], "the finished record goes too, as every settler's does"
    # batch 6 became visible here: the commit head (what asset watchers poll) says so
    from airflow_sparkpoint.checkpoints.commit_head import read_commit_head

    head = read_commit_head(catalog)
    assert head is not None and (head.batch, head.txn_id) == (6, claimed.txn_id)


def test_a_rollback_deletes_the_record_of_what_it_finished_and_fires_abort_halfway(
    catalog: Catalog, sink: DirectorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`abort_generation` settles as every other settler does (`settle_all`): the record of
    a transaction it finished (it held its batch's commit) is deleted once the commit head
    says the batch is visible, as the stop's, the commit step's and recovery's are; and the
    fault point ``abort`` fires at the halfway mark of what it settles, finished or aborted.
    Failed on the old code: the finished record was kept, and the fault point counted only
    aborts, so with a finished transaction first it never fired at the halfway mark."""
    claimed, pending = staged(sink, 6, 3), staged(sink, 7, 3)
    for _ in range(3):
        catalog.claim_generation()
    for r in (claimed, pending):
        catalog.put_transaction(r)
    with monkeypatch.context() as patch:
        kill_at(patch, "promoting")
        with pytest.raises(Died):
            sink.commit(claimed)
    fired: list[tuple[str, int, int, int]] = []

    with monkeypatch.context() as patch:
        patch.setattr(faults, "maybe_kill_halfway",
                      lambda point, batch, done, total: fired.append((point, batch, done, total)))
        assert abort_generation(catalog, 3) == [pending.txn_id]

    assert fired == [("abort", 6, 1, 2), ("abort", 7, 2, 2)]
    assert catalog.transactions() == []
    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [600, 601, 602] and leftovers(sink) == []
    from airflow_sparkpoint.checkpoints.commit_head import read_commit_head

    head = read_commit_head(catalog)
    assert head is not None and (head.batch, head.txn_id) == (6, claimed.txn_id)
    assert abort_generation(catalog, 3) == [], "a second rollback finds nothing left"


def test_a_rollback_killed_at_abort_after_finishing_a_transaction_is_finished_by_its_retry(
    catalog: Catalog, sink: DirectorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault point ``abort`` fires before the settled record is deleted (as the stop's
    and the commit step's do): a kill there leaves the finished transaction's record, and
    the retry settles it again (idempotent: ``already``), moves the commit head and
    deletes it, then aborts the rest; the output is exactly batch 6's."""
    claimed, pending = staged(sink, 6, 3), staged(sink, 7, 3)
    for _ in range(3):
        catalog.claim_generation()
    for r in (claimed, pending):
        catalog.put_transaction(r)
    with monkeypatch.context() as patch:
        kill_at(patch, "promoting")
        with pytest.raises(Died):
            sink.commit(claimed)

    def killed(point: str, batch: int, done: int, total: int) -> None:
        if point == "abort" and done == max(1, total // 2):
            raise Died(point)

    with monkeypatch.context() as patch:
        patch.setattr(faults, "maybe_kill_halfway", killed)
        with pytest.raises(Died):
            abort_generation(catalog, 3)
    assert [r.txn_id for r in catalog.transactions()] == [claimed.txn_id, pending.txn_id]
    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [600, 601, 602], "finished before the kill"
    assert catalog.current_generation() == 4

    assert abort_generation(catalog, 3) == [pending.txn_id]

    assert catalog.transactions() == []
    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [600, 601, 602] and leftovers(sink) == []
    from airflow_sparkpoint.checkpoints.commit_head import read_commit_head

    head = read_commit_head(catalog)
    assert head is not None and (head.batch, head.txn_id) == (6, claimed.txn_id)
