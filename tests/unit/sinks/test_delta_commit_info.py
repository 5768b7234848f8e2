"""The custom commit info of Sparkpoint's Delta commits has one home (`sinks._delta_txn`):
what `commit_info` writes, `sparkpoint_commit` reads back (the demo's and the services'
`delta_history` read it so, issue #47)."""

from __future__ import annotations

from airflow_sparkpoint.sinks._delta_txn import commit_info, job_staging, sparkpoint_commit, staging_dir
from tests.support.records import transaction_record


def test_the_commit_info_written_is_read_back_as_job_batch_and_generation() -> None:
    record = transaction_record("delta", batch=7, generation=3, job="totals")
    assert sparkpoint_commit(commit_info(record)) == {"job": "totals", "batch": 7, "generation": 3}
    assert sparkpoint_commit({"operation": "WRITE"}) == {"job": None, "batch": None, "generation": None}


def test_a_transactions_staging_area_is_under_its_jobs() -> None:
    assert job_staging("totals") == "_sparkpoint_txn/totals"
    assert staging_dir("totals", "totals-b7-g3").startswith(job_staging("totals") + "/")
