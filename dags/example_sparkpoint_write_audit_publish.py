"""
### Write-audit-publish with a two-phase commit

Deduplicated events (``jobs/dedup_events.py``) become visible in the Delta table only
after a data-quality audit approved them:

1. **write** – the job runs with ``commit_mode="external"``: every micro-batch is
   *staged* next to the table (invisible to readers) and recorded as a pending
   transaction; its checkpoint confirms it.
2. **audit** – reads every staged, not yet published row (what **publish** would
   publish) through ``SparkpointHook.staged_rows`` (the same connection and credentials
   as the job, so on S3 too) and checks them: required fields present, amounts not negative, no event
   id already published (``SparkpointHook.delta_rows``) or staged twice. It picks the
   next task.
3. **publish** – `SparkpointCommitOperator`: one idempotent Delta commit per confirmed
   batch. Or **discard** – the same operator with ``abort_generation`` (this run's, from
   the write task's result): the staged output is deleted and never becomes visible;
   **rejected** then fails the run so the rejection alerts. The job's checkpoints have
   moved past the discarded input: to process it again, fix it and restore a savepoint
   or checkpoint taken before it.

Storage: the ``sparkpoint_default`` connection (``file://`` or ``s3://``; for S3 also
the endpoint and credentials, which reach the job through its environment). Spark: the
``spark_default`` connection and the cluster's ``spark-defaults.conf``. Spark's live
checkpoint goes to ``$SPARKPOINT_WORK_DIR`` when set (required with an ``s3://`` root).

Params: ``input`` (raw events, JSON lines), ``output`` (the Delta table: a path or
``s3://``). Run it whenever new input landed (hourly here); a retry of **write**
resumes from the latest checkpoint.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_sparkpoint.hooks import SparkpointHook
from airflow_sparkpoint.operators import SparkpointCommitOperator, SparkpointSubmitOperator

JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "dedup_events.py")
JOB_NAME = "wap_events"
STORAGE = "sparkpoint_default"  # the sparkpoint connection: storage root, S3 endpoint, credentials
DATA = "/opt/sparkpoint/data/write-audit-publish"

log = logging.getLogger(__name__)


with DAG(
    dag_id="example_sparkpoint_write_audit_publish",
    description="Stage deduplicated events, audit the staged rows, then publish or discard them",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "write-audit-publish", "two-phase-commit"],
    params={
        "input": Param(f"{DATA}/input", type="string", description="raw events (JSON lines)"),
        "output": Param(f"{DATA}/events", type="string", description="the published Delta table (path or s3://)"),
    },
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
) as dag:
    write = SparkpointSubmitOperator(
        task_id="write",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=["--input", "{{ params.input }}", "--output", "{{ params.output }}"],
        job_name=JOB_NAME,
        sparkpoint_conn_id=STORAGE,
        work_dir=os.environ.get("SPARKPOINT_WORK_DIR") or None,
        trigger="availableNow",
        commit_mode="external",  # stage and record; publishing is this DAG's decision
    )

    @task.branch(retries=0)
    def audit(result: dict[str, Any], params: Any = None) -> str:
        """Data-quality rules on the staged rows; returns the task to run next."""
        hook = SparkpointHook(STORAGE)
        rows = hook.staged_rows(JOB_NAME)  # everything publish would commit, this run's and any earlier try's
        log.info("auditing generation %s of job %s: %d staged rows", result["generation"], JOB_NAME,
                 len(rows))
        published = {row["event_id"] for row in hook.delta_rows(params["output"], columns=["event_id"])}
        problems: list[str] = []
        seen: set[str] = set()
        for row in rows:
            if row["event_id"] is None or row["ts"] is None or row["user"] is None:
                problems.append(f"missing field in {row}")
            elif row["event_id"] in published or row["event_id"] in seen:
                problems.append(f"event {row['event_id']} would be published twice")
            if row["amount"] is not None and row["amount"] < 0:
                problems.append(f"event {row['event_id']}: negative amount {row['amount']}")
            seen.add(row["event_id"])
        if problems:
            log.warning("audit rejected %d staged rows: %s", len(rows), problems)
            return "discard"
        log.info("audit approved %d staged rows", len(rows))
        return "publish"

    publish = SparkpointCommitOperator(task_id="publish", job_name=JOB_NAME, sparkpoint_conn_id=STORAGE)

    discard = SparkpointCommitOperator(
        task_id="discard",
        job_name=JOB_NAME,
        sparkpoint_conn_id=STORAGE,
        abort_generation=write.output["generation"],
    )

    @task(retries=0)
    def rejected(discarded: dict[str, list[str]]) -> None:
        raise AirflowFailException(f"the audit rejected the staged output; discarded {discarded['aborted']}")

    audit(write.output) >> [publish, discard]
    rejected(discard.output)
