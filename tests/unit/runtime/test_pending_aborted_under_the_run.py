"""External commit mode: a checkpoint forgets the pending transactions whose records the
commit step deleted, as settled. A pending one whose abort stands was aborted under the
live run (a review found two rollbacks doing so: their lineage check missed the run): the
run's state includes it and the sink never will, so the checkpoint fails instead of
dropping it without a word, unless a newer generation was claimed (its lineage settled
it: the run is stale). A real directory sink, real records in a memory store."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.exceptions import SinkLineageError, StaleGeneration
from airflow_sparkpoint.runtime.checkpointer import Checkpointer
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import checkpointer
from tests.support.live_dirs import write_live
from tests.support.sink_files import staged_transaction

JOB = "job"
Run = tuple[Catalog, DirectorySink, Checkpointer, int]


@pytest.fixture()
def run(tmp_path: Path) -> Run:
    """A live external-mode run of generation g with batches 0 and 1 pending (checkpointed
    at batch 1), its directory sink, its checkpointer."""
    catalog = Catalog(MemoryStorage(f"abort-under-{uuid.uuid4().hex[:8]}"), JOB)
    sink = DirectorySink(str(tmp_path / "out"), "json")
    g = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path / "live", sink, g, commit_mode="external")
    for batch in (0, 1):
        record = staged_transaction(sink, batch, g, job=JOB)
        catalog.put_transaction(record)
        coord.transactions.add_pending(record)
    write_live(tmp_path / "live", 1)
    first = coord.checkpoint(1)
    assert first is not None and [t.batch_id for t in first.transactions] == [0, 1]
    return catalog, sink, coord, g


def _abort_and_delete(catalog: Catalog, sink: DirectorySink, batch: int, generation: int) -> None:
    """What the rollbacks of the review did to a transaction the run confirms."""
    record = next(r for r in catalog.transactions() if (r.batch_id, r.generation) == (batch, generation))
    sink.abort(record)
    catalog.delete_transactions([record])
    assert sink.decision(record) == "abort"


def test_a_pending_transaction_aborted_under_the_live_run_fails_its_next_checkpoint(
        run: Run, tmp_path: Path) -> None:
    catalog, sink, coord, g = run
    _abort_and_delete(catalog, sink, 0, g)
    write_live(tmp_path / "live", 2)
    with pytest.raises(SinkLineageError, match=rf"transaction {JOB}-b0-g{g} \(batch 0\).*was aborted"):
        coord.checkpoint(2)
    assert [m.batch_id for m in catalog.checkpoints()] == [1], "a checkpoint went on without batch 0"
    assert sorted(coord.transactions.pending) == [(0, g), (1, g)], "the run forgot the aborted batch"


def test_a_pending_transaction_aborted_after_a_newer_claim_ends_the_run_stale(
        run: Run, tmp_path: Path) -> None:
    catalog, sink, coord, g = run
    catalog.claim_generation()  # a newer one: its recovery aborts what its start point does not confirm
    _abort_and_delete(catalog, sink, 0, g)
    write_live(tmp_path / "live", 2)
    with pytest.raises(StaleGeneration):
        coord.checkpoint(2)


def test_transactions_the_commit_step_committed_are_forgotten(run: Run, tmp_path: Path) -> None:
    catalog, _sink, coord, g = run
    outcome = commit_pending(catalog)
    assert sorted(outcome["committed"]) == [f"{JOB}-b{b}-g{g}" for b in (0, 1)], outcome
    write_live(tmp_path / "live", 2)
    second = coord.checkpoint(2)
    assert second is not None and second.transactions == ()
    assert coord.transactions.pending == {}
