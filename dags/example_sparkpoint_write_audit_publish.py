"""
### Write-audit-publish with a two-phase commit

Deduplicated events (``jobs/dedup_events.py``) become visible in the Delta table only
after a data-quality audit approved them:

1. **write** – the job runs with ``commit_mode="external"``: every micro-batch is
   *staged* next to the table (invisible to readers) and recorded as a pending
   transaction; its checkpoint confirms it.
2. **audit** – reads the staged rows through the pending transaction records
   (``Catalog.transactions()``; for a Delta sink the record lists the staged parquet
   files, relative to the table) and checks them: required fields present, amounts not
   negative, no event id already published or staged twice. It picks the next task.
3. **publish** – `SparkpointCommitOperator`: one idempotent Delta commit per confirmed
   batch. Or **discard** – the same operator with ``abort_generation``: the run's staged
   output is deleted and never becomes visible; **rejected** then fails the run so the
   rejection alerts. The job's checkpoints have moved past the discarded input: to
   process it again, fix it and restore a savepoint or checkpoint taken before it.

Params: ``input``, ``output``, ``checkpoint_dir``. Run it whenever new input landed
(hourly here); a retry of **write** resumes from the latest checkpoint.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_sparkpoint.hooks import SparkpointHook
from airflow_sparkpoint.operators import SparkpointCommitOperator, SparkpointSubmitOperator

JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "dedup_events.py")
JOB_NAME = "wap_events"
BASE = "/tmp/sparkpoint-wap"
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN"}

log = logging.getLogger(__name__)


def _staged_rows(checkpoint_dir: str) -> list[dict[str, Any]]:
    """Every row staged but not yet published, from the pending transaction records."""
    import pyarrow.parquet as pq

    from airflow_sparkpoint.sinks import sink_from_config

    catalog = SparkpointHook(None, storage_uri=checkpoint_dir).get_catalog(JOB_NAME)
    rows: list[dict[str, Any]] = []
    for record in catalog.transactions():  # in batch order
        table_path = sink_from_config(record.sink, record.payload["config"]).path
        for staged_file in record.payload["staged"]["files"]:
            rows += pq.read_table(f"{table_path}/{staged_file['path']}").to_pylist()
    return rows


def _published_ids(table_path: str) -> set[str]:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(table_path):
        return set()
    return set(DeltaTable(table_path).to_pyarrow_table(columns=["event_id"]).column("event_id").to_pylist())


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
        "input": Param(f"{BASE}/input", type="string", description="raw events (JSON lines)"),
        "output": Param(f"{BASE}/events", type="string", description="the published Delta table"),
        "checkpoint_dir": Param(f"{BASE}/checkpoints", type="string", description="Sparkpoint storage root"),
    },
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
) as dag:
    write = SparkpointSubmitOperator(
        task_id="write",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=["--input", "{{ params.input }}", "--output", "{{ params.output }}"],
        conf=SPARK_CONF,
        job_name=JOB_NAME,
        checkpoint_dir="{{ params.checkpoint_dir }}",
        trigger="availableNow",
        commit_mode="external",  # stage and record; publishing is this DAG's decision
    )

    @task.branch(retries=0)
    def audit(params: Any = None) -> str:
        """Data-quality rules on the staged rows; returns the task to run next."""
        rows = _staged_rows(params["checkpoint_dir"])
        published = _published_ids(params["output"])
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

    publish = SparkpointCommitOperator(task_id="publish", job_name=JOB_NAME,
                                       checkpoint_dir="{{ params.checkpoint_dir }}")

    discard = SparkpointCommitOperator(
        task_id="discard",
        job_name=JOB_NAME,
        checkpoint_dir="{{ params.checkpoint_dir }}",
        abort_generation="{{ ti.xcom_pull(task_ids='write')['generation'] }}",
    )

    @task(retries=0)
    def rejected(ti: Any = None) -> None:
        aborted = ti.xcom_pull(task_ids="discard")["aborted"]
        raise AirflowFailException(f"the audit rejected the staged output; discarded {aborted}")

    write >> audit() >> [publish, discard]
    discard >> rejected()
