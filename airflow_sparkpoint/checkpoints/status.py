"""The status record of a job: what the current generation is doing, with a heartbeat."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
STATES = ("starting", "running", "finished", "stopped", "failed")


@dataclass(frozen=True)
class JobStatus:
    """Written by the running job at start, after every checkpoint and on every heartbeat."""

    job: str
    generation: int
    state: str
    started_at: float
    heartbeat_at: float
    last_batch: int | None = None
    last_checkpoint_id: int | None = None
    last_checkpoint_uri: str | None = None
    checkpoints_completed: int = 0
    savepoint_uri: str | None = None
    error: str | None = None
    host: str = ""
    pid: int = 0
    application_id: str = ""
    schema_version: int = SCHEMA_VERSION

    def with_(self, **changes: Any) -> JobStatus:
        return replace(self, **changes)

    def is_alive(self, max_age_s: float, now: float | None = None) -> bool:
        """Running, and its heartbeat is younger than `max_age_s`."""
        now = time.time() if now is None else now
        return self.state in ("starting", "running") and now - self.heartbeat_at <= max_age_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobStatus:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def read_job_status(catalog: Catalog) -> JobStatus | None:
    """The job's status record, or None when there is none (or it is unreadable: logged)."""
    raw = catalog.read_status()
    if raw is None:
        return None
    try:
        return JobStatus.from_json(raw)
    except (TypeError, ValueError) as exc:
        log.warning("status record of job %r is incomplete (%s); treating the job as not running", catalog.job, exc)
        return None
