"""`DeltaSink` commits per transaction, without Spark: batches are staged by hand (parquet
files under the transaction's staging area, as `DeltaSink.stage` writes them) into real
Delta tables. Which transaction landed a batch is read from the commit info, so another
generation's commit of the same batch is a conflict, never a silent "already"; batch 0
is a batch like any other; a commit and an abort of one transaction exclude each other."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import SinkError, TransactionConflict
from airflow_sparkpoint.sinks import DeltaSink
from airflow_sparkpoint.sinks.base import CommittedTxn
from tests.support.delta_staging import JOB, staged, table_rows
from tests.support.records import snapshot_metadata


@pytest.fixture(params=["append", "merge"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaSink:
    if request.param == "merge":
        return DeltaSink(str(tmp_path / "t"), mode="merge", keys=["user"])
    return DeltaSink(str(tmp_path / "t"))


def test_a_commit_that_raised_after_landing_batch_0_counts_as_landed(
    sink: DeltaSink, monkeypatch: Any
) -> None:
    """``transaction_version(...) or -1`` took version 0 for "nothing committed"."""
    method = "_merge" if sink.mode == "merge" else "_append"
    original = getattr(DeltaSink, method)

    def lands_then_times_out(self: DeltaSink, *args: Any) -> None:
        original(self, *args)
        raise TimeoutError("the response was lost after the log entry was written")

    monkeypatch.setattr(DeltaSink, method, lands_then_times_out)
    record = staged(sink, 0, 1, [("a", 1)])

    assert sink.commit(record).status == "committed"
    assert sink.is_committed(record) and table_rows(sink) == [("a", 1)]


def test_another_generations_commit_of_the_batch_is_a_conflict_not_already(sink: DeltaSink) -> None:
    first = staged(sink, 0, 1, [("a", 1)])
    sink.commit(first)
    rerun = staged(sink, 0, 2, [("a", 5), ("b", 7)])  # a re-run whose batch holds other rows

    assert sink.is_committed(first) and not sink.is_committed(rerun)
    with pytest.raises(TransactionConflict, match=r"by transaction job-b0-g1 \(generation 1\); transaction "
                                                  r"'job-b0-g2' \(generation 2\)"):
        sink.commit(rerun)

    assert not os.path.exists(os.path.join(sink.path, rerun.payload["staged"]["staging"]))
    assert table_rows(sink) == [("a", 1)]
    assert sink.committed_txn(JOB, 0) == CommittedTxn(JOB, 0, 1, "job-b0-g1")
    assert sink.committed_txn(JOB, 1) is None
    assert sink.commit(first).status == "already"


def test_an_aborted_transaction_is_never_committed_afterwards(sink: DeltaSink) -> None:
    """A zombie that wakes after the newer generation's recovery aborted its transaction."""
    zombie = staged(sink, 0, 1, [("a", 1)])
    sink.abort(zombie)
    assert not os.path.exists(os.path.join(sink.path, zombie.payload["staged"]["staging"]))

    with pytest.raises(SinkError, match="was aborted") as info:
        sink.commit(zombie)
    assert not isinstance(info.value, TransactionConflict)
    rerun = staged(sink, 0, 2, [("b", 2)])
    assert sink.commit(rerun).status == "committed"
    with pytest.raises(TransactionConflict):
        sink.commit(zombie)
    assert table_rows(sink) == [("b", 2)]


def test_an_abort_finishes_a_commit_that_was_decided_and_stalled(sink: DeltaSink) -> None:
    record = staged(sink, 0, 1, [("a", 1)])
    sink._decide(record, "promote")  # the committer decided, then stalled (or died) before its Delta commit

    with pytest.raises(SinkError, match="has committed"):
        sink.abort(record)

    assert sink.is_committed(record) and table_rows(sink) == [("a", 1)]


def test_a_batch_undone_by_a_rewind_is_not_committed_again(sink: DeltaSink) -> None:
    records = [staged(sink, b, 1, [(f"u{b}", b)]) for b in range(3)]
    for r in records[:2]:
        sink.commit(r)
    sink._decide(records[2], "promote")
    sink.commit(records[2])
    assert sink.committed_txn(JOB, 2) is not None
    snapshot = snapshot_metadata(1, job=JOB)

    sink.rewind(JOB, snapshot)

    assert sink.committed_position(JOB) == 1 and sink.committed_txn(JOB, 2) is None
    assert not sink.is_committed(records[2]) and sink.is_committed(records[1])
    sink.abort(records[2])  # decided promote, landed once, undone: garbage, not committed again
    assert table_rows(sink) == [("u0", 0), ("u1", 1)]
    assert sink.cleanup_orphans(JOB, keep=set()) == 0


def test_cleanup_keeps_a_decided_commit_that_has_not_landed(sink: DeltaSink) -> None:
    decided, dead = staged(sink, 0, 1, [("a", 1)]), staged(sink, 1, 1, [("b", 1)])
    sink._decide(decided, "promote")

    assert sink.cleanup_orphans(JOB, keep=set()) == 1  # the undecided one goes, and can never commit

    assert os.path.exists(os.path.join(sink.path, decided.payload["staged"]["staging"]))
    with pytest.raises(SinkError, match="was aborted"):
        sink.commit(dead)
    assert sink.commit(decided).status == "committed"


def test_the_history_scan_skips_commits_a_restore_undid() -> None:
    from airflow_sparkpoint.sinks import _delta_txn as delta_txn

    def commit(version: int, batch: int, generation: int) -> dict[str, Any]:
        return {"version": version, "operation": "WRITE", "sparkpoint.job": JOB,
                "sparkpoint.batch": str(batch), "sparkpoint.generation": str(generation)}

    restore = {"version": 3, "operation": "RESTORE", "operationParameters": {"version": "1"},
               "sparkpoint.job": JOB}
    history = [commit(4, 2, 2), restore, commit(2, 2, 1), commit(1, 1, 1), commit(0, 0, 1)]  # newest first

    assert delta_txn._scan(history, JOB, 2)["sparkpoint.generation"] == "2"
    assert delta_txn._scan(history[1:], JOB, 2) is None  # g1's batch 2 was undone; batch 1 is below it
    assert delta_txn._scan(history, JOB, 1)["version"] == 1
    assert delta_txn._scan(history[:2], JOB, 0) is delta_txn._UNKNOWN  # look further back
    assert delta_txn._scan([{"version": 5, "operation": "RESTORE",
                             "operationParameters": {"timestamp": "x"}}],
                           JOB, 0) is delta_txn._UNKNOWN


def test_a_decided_commit_that_can_never_land_is_aborted(sink: DeltaSink) -> None:
    import shutil

    record = staged(sink, 0, 1, [("a", 1)])
    sink._decide(record, "promote")
    shutil.rmtree(os.path.join(sink.path, record.payload["staged"]["staging"]))  # its staged files are gone

    sink.abort(record)  # helping it land fails for certain: aborted, not a wedge

    assert not sink.is_committed(record) and sink.committed_position(JOB) is None
