"""Review (issue 45, 6251061): the recovery checks its fence before it refuses a
confirmed batch "aborted since". A start that is NOT fenced (the newest generation, the
claim it recovers as) still refuses, loudly; only one a newer claim superseded ends as
a stale generation. Real records in a memory store, the recording sink."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.exceptions import SinkLineageError, StaleGeneration
from airflow_sparkpoint.runtime.recovery import recover_transactions
from airflow_sparkpoint.runtime.restore import plan_restore
from tests.support.checkpointers import catalog, checkpointer, run_config
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live

__all__ = ["catalog"]  # the fixture


def _aborted_since(catalog, tmp_path) -> RecordingSink:  # type: ignore[no-untyped-def]
    """Generation 1 checkpointed batches 0 and 1 as pending (external mode); the commit
    step then published 0 and aborted 1 (both records deleted). Returns the sink."""
    first = catalog.claim_generation().generation
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), first, commit_mode="external")
    for batch in (0, 1):
        write_live(live, batch)
        catalog.put_transaction(recording_record(batch, first))
        coord.transactions.add_pending(recording_record(batch, first))
    coord.checkpoint(1)
    sink = RecordingSink()
    sink.commit(recording_record(0, first))
    catalog.delete_transactions([recording_record(0, first), recording_record(1, first)])
    return sink


def test_an_unfenced_start_still_refuses_a_batch_aborted_since(catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sink = _aborted_since(catalog, tmp_path)
    start = catalog.claim_generation().generation  # the newest claim: not fenced
    with pytest.raises(SinkLineageError, match=r"\(batch 1\).*was aborted since"):
        recover_transactions(catalog, sink, plan_restore(run_config(), catalog, None), "checkpoint", start)
    assert sink.committed == {0: 1}


def test_only_a_start_a_newer_claim_fenced_ends_stale(catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sink = _aborted_since(catalog, tmp_path)
    start = catalog.claim_generation().generation
    catalog.claim_generation()  # a newer start: this one is fenced
    with pytest.raises(StaleGeneration):
        recover_transactions(catalog, sink, plan_restore(run_config(), catalog, None), "checkpoint", start)
    assert sink.committed == {0: 1}
