"""External commit mode: a checkpoint forgets the pending transactions the commit step
settled (their records are gone). Spark stages the next batch meanwhile, on its own
thread: a record written and added to the pending set right after the checkpoint listed
the catalog is not settled and must stay pending (issue #27.5: a loss path found while
looking for a batch missing after a successful run)."""

from __future__ import annotations

from pathlib import Path

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.services.commit import commit_pending
from tests.support.checkpointers import catalog, checkpointer
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live

__all__ = ["catalog"]  # the fixture


def test_a_batch_recorded_while_a_checkpoint_lists_the_settled_ones_stays_pending(
    catalog: Catalog, tmp_path: Path, monkeypatch: object
) -> None:
    generation = catalog.claim_generation().generation
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), generation, commit_mode="external")
    write_live(live, 0)
    catalog.put_transaction(recording_record(0, generation))
    coord.transactions.add_pending(recording_record(0, generation))
    listed = catalog.transaction_keys
    staged_meanwhile: list[int] = []

    def listing_then_spark_stages_batch_1() -> set[tuple[int, int]]:
        keys = listed()
        if not staged_meanwhile:  # Spark's foreachBatch of batch 1, right after the listing
            catalog.put_transaction(recording_record(1, generation))
            coord.transactions.add_pending(recording_record(1, generation))
            staged_meanwhile.append(1)
        return keys

    catalog.transaction_keys = listing_then_spark_stages_batch_1  # type: ignore[method-assign]
    first = coord.checkpoint(0)
    assert staged_meanwhile == [1], "the checkpoint never listed the settled transactions"
    assert first is not None and [t.batch_id for t in first.transactions] == [0]

    write_live(live, 1)
    second = coord.checkpoint(1)
    assert second is not None
    assert [t.batch_id for t in second.transactions] == [0, 1], "batch 1 was dropped from the pending set"
    outcome = commit_pending(catalog)
    assert sorted(outcome["committed"]) == [f"job-b{b}-g{generation}" for b in (0, 1)], outcome
    assert outcome["aborted"] == [] and catalog.transactions() == []
