"""History and status of a job: the read model (`checkpoints.history`) as the front ends
see it, and the few rules they apply to it.

Every figure `sparkpoint list` / `status` / `metrics`, the demo, the checkpoint sensor,
the UI page and the health check show comes from the one read model, so no two of them
compute it differently. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.commit_head import CommitHead, read_commit_head
from airflow_sparkpoint.checkpoints.display import iso, size
from airflow_sparkpoint.checkpoints.history import (
    GenerationRecord,
    PipelineHistory,
    SnapshotRecord,
    current_status,
    generation_alive,
    generation_records,
    live_status,
    liveness,
    load_history,
    open_requests,
    plan_origin,
    read_generation,
    short_name,
    snapshot_records,
)
from airflow_sparkpoint.checkpoints.status import JobStatus, current_of, read_job_status

__all__ = [
    "CommitHead", "GenerationRecord", "JobStatus", "PipelineHistory", "SnapshotRecord", "commit_head",
    "current_of",
    "current_status", "generation_alive", "generation_records", "iso", "live_status", "liveness",
    "load_history",
    "open_requests", "plan_origin", "read_generation", "read_job_status", "short_name", "size",
    "skipped_checkpoints", "snapshot_records",
]


def skipped_checkpoints(history: PipelineHistory) -> list[SnapshotRecord]:
    """The invalid checkpoints newer than the latest completed one (what ``restore=latest``
    skips over, as the catalog warns), without those that are only incomplete."""
    latest = history.latest_completed
    return [record for record in history.checkpoints
            if record.error and "no _metadata" not in record.error
            and (latest is None or record.id > latest.id)]


def commit_head(catalog: Catalog) -> CommitHead | None:
    """The newest sink commit of `catalog`'s job (``committed.json``), or None.

    :raises SparkpointError: the record cannot be read.
    """
    return read_commit_head(catalog)
