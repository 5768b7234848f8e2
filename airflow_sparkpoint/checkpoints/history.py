"""The history read model: what the store says about one job, as typed records.

Every figure that `sparkpoint list` / `status` / `metrics`, the demo, the checkpoint
sensor, the Airflow UI page and the health check show comes from here, so no two of them
compute it differently::

    snapshot_records(catalog, kind)   retained checkpoints / savepoints, valid or not,
                                      with status, superseded_by, state partitions and
                                      the last restore drill
    generation_records(catalog)       the newest generations: what each restored, its
                                      Airflow task try, the configuration in force, how it ended
    current_status / live_status      the current run's status record and whether it is live
    load_history(catalog)             all of it, with counts, latest completed / failed /
                                      savepoint / restore, min-avg-max summary, pending
                                      control requests, staged transactions and the
                                      newest zero-downtime cutovers (`CUTOVERS_SHOWN`)

Cost: O(retained history). Listings of the checkpoint, savepoint, generation, control and
transaction prefixes; one GET per retained snapshot (plus its drill record), per shown
generation (`GENERATIONS_SHOWN`) and per pending request or transaction; a listing of
``cutover/`` and six GETs per shown cutover. Lifetime counts
come from the small counters record (`checkpoints.counters`), never from a scan.

Pure Python over a `Catalog`: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.counters import CheckpointCounters, read_counters
from airflow_sparkpoint.checkpoints.cutover import CutoverState, CutoverStore
from airflow_sparkpoint.checkpoints.history_records import (
    AIRFLOW_CONTEXT_ENV,
    CONFIG_FIELDS,
    GENERATIONS_SHOWN,
    AirflowTry,
    ControlRecord,
    GenerationRecord,
    SnapshotRecord,
    StagedRecord,
    generation_details,
    generation_records,
    iso,
    open_requests,
    plan_origin,
    read_generation,
    short_name,
    snapshot_records,
    staged_transactions,
)
from airflow_sparkpoint.checkpoints.status import JobStatus, current_status, read_job_status

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = [
    "AIRFLOW_CONTEXT_ENV", "CONFIG_FIELDS", "CUTOVERS_SHOWN",
    "GENERATIONS_SHOWN", "AirflowTry", "ControlRecord", "Counts",
    "GenerationRecord", "PipelineHistory", "SnapshotRecord", "StagedRecord", "Stat", "current_status",
    "generation_alive",
    "generation_details", "generation_records", "iso", "live_status", "liveness", "load_history",
    "open_requests",
    "plan_origin", "read_generation", "read_job_status", "short_name", "snapshot_records",
    "staged_transactions",
]

log = logging.getLogger(__name__)

#: the newest cutovers a history shows (each is six small reads)
CUTOVERS_SHOWN = 5

# ---------------------------------------------------------------------------- status


def liveness(status: JobStatus | None, current_generation: int, max_heartbeat_age: float,
             *, now: float | None = None) -> tuple[bool, float | None]:
    """(alive, heartbeat age in seconds): alive is starting/running, a heartbeat younger
    than `max_heartbeat_age`, and not superseded by a newer generation."""
    if status is None:
        return False, None
    now = time.time() if now is None else now
    age = max(0.0, now - float(status.heartbeat_at))
    alive = status.is_alive(max_heartbeat_age, now) and int(status.generation) >= current_generation
    return alive, age


def live_status(catalog: Catalog, max_heartbeat_age: float, *, now: float | None = None) -> JobStatus | None:
    """The status of the job's live run (see `liveness`, `current_status`), or None when no run is live."""
    status, current = current_status(catalog)
    if status is None or not status.is_alive(max_heartbeat_age, now):
        return None
    if status.generation < current:
        return None
    return status


def generation_alive(catalog: Catalog, generation: int | None, max_heartbeat_age: float) -> bool:
    """Whether the run of `generation` (any, when None) is live (see `live_status`)."""
    status = live_status(catalog, max_heartbeat_age)
    return status is not None and (generation is None or status.generation == generation)


# ---------------------------------------------------------------------------- the whole view


@dataclass(frozen=True)
class Stat:
    """min / avg / max of one figure over the retained history."""

    min: float
    avg: float
    max: float

    @classmethod
    def of(cls, values: Iterable[int | None]) -> Stat | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return cls(min(known), sum(known) / len(known), max(known))

    def to_json(self) -> dict[str, float]:
        return {"min": self.min, "avg": round(self.avg, 3), "max": self.max}


@dataclass(frozen=True)
class Counts:
    """Flink's checkpoint counts. `lifetime`: completed/failed/restored come from the
    counters record (every checkpoint ever); otherwise from the retained history only."""

    completed: int
    failed: int
    in_progress: int
    restored: int
    lifetime: bool

    def to_json(self) -> dict[str, Any]:
        return {"completed": self.completed, "failed": self.failed, "in_progress": self.in_progress,
                "restored": self.restored, "lifetime": self.lifetime}


@dataclass(frozen=True)
class PipelineHistory:
    """Everything the store says about one job (see the module docstring)."""

    job: str
    root: str
    generated_at: float
    generation: int
    status: JobStatus | None
    alive: bool
    heartbeat_age: float | None
    max_heartbeat_age: float
    checkpoints: tuple[SnapshotRecord, ...]
    savepoints: tuple[SnapshotRecord, ...]
    generations: tuple[GenerationRecord, ...]
    counters: CheckpointCounters | None
    requests: tuple[ControlRecord, ...] = ()
    staged: tuple[StagedRecord, ...] = ()
    #: the newest zero-downtime cutovers, newest first (`CUTOVERS_SHOWN`)
    cutovers: tuple[CutoverState, ...] = ()

    # -- derived figures (each computed here and only here)

    @property
    def completed(self) -> list[SnapshotRecord]:
        """Valid checkpoints, newest first (superseded ones included: their files are intact)."""
        return [r for r in self.checkpoints if r.valid]

    @property
    def latest_completed(self) -> SnapshotRecord | None:
        """The newest checkpoint ``restore=latest`` would choose."""
        restorable = [r for r in self.checkpoints if r.restorable]
        return max(restorable, key=lambda r: (r.created_at or 0.0, r.id), default=None)

    @property
    def in_progress(self) -> list[SnapshotRecord]:
        """Incomplete checkpoint directories newer than every valid one while the job is alive."""
        newest = max((r.id for r in self.completed), default=-1)
        return [r for r in self.checkpoints if not r.valid and r.id > newest and self.alive
                and r.error is not None and "no _metadata" in r.error]

    @property
    def failed(self) -> list[SnapshotRecord]:
        """Retained checkpoint directories that are invalid and not in progress: abandoned or corrupt."""
        running = {r.id for r in self.in_progress}
        return [r for r in self.checkpoints if not r.valid and r.id not in running]

    @property
    def latest_failed(self) -> SnapshotRecord | None:
        return max(self.failed, key=lambda r: r.id, default=None)

    @property
    def last_failure_at(self) -> float | None:
        """When the newest failed checkpoint attempt ended (counters record), if known."""
        failures = [at for at, ok in (self.counters.recent if self.counters else ()) if not ok]
        return max(failures, default=None)

    @property
    def latest_savepoint(self) -> SnapshotRecord | None:
        valid = [r for r in self.savepoints if r.valid]
        return max(valid, key=lambda r: (r.created_at or 0.0, r.id), default=None)

    @property
    def latest_restore(self) -> GenerationRecord | None:
        """The newest generation that started from a snapshot."""
        return next((g for g in self.generations if g.restored), None)

    @property
    def current(self) -> GenerationRecord | None:
        """The newest generation's record."""
        return self.generations[0] if self.generations and self.generations[0].generation == self.generation \
            else None

    @property
    def config(self) -> Mapping[str, Any]:
        """The settings in force: those the newest generation that recorded them ran with."""
        return next((g.config for g in self.generations if g.config), {})

    @property
    def counts(self) -> Counts:
        if self.counters is not None:
            return Counts(self.counters.completed, self.counters.failed, len(self.in_progress),
                          self.counters.restored, True)
        return Counts(len(self.completed), len(self.failed), len(self.in_progress),
                      sum(1 for g in self.generations if g.restored), False)

    @property
    def duration_ms(self) -> Stat | None:
        return Stat.of(r.duration_ms for r in self.completed)

    @property
    def bytes_copied(self) -> Stat | None:
        return Stat.of(r.bytes_copied for r in self.completed)

    @property
    def bytes_total(self) -> Stat | None:
        return Stat.of(r.bytes_total for r in self.completed)

    @property
    def dag_ids(self) -> list[str]:
        """The DAGs whose tasks started the shown generations (where recorded), sorted."""
        return sorted({g.airflow.dag_id for g in self.generations if g.airflow is not None})

    def age_of_latest(self) -> float | None:
        """Seconds from the latest completed checkpoint to `generated_at`."""
        latest = self.latest_completed
        if latest is None or latest.created_at is None:
            return None
        return max(0.0, self.generated_at - latest.created_at)

    def to_json(self) -> dict[str, Any]:
        status = self.status
        latest, failed, savepoint, restore = (self.latest_completed, self.latest_failed,
                                              self.latest_savepoint, self.latest_restore)
        current = self.current
        return {
            "job": self.job,
            "root": self.root,
            "generated_at": self.generated_at,
            "generation": self.generation,
            "state": (status.state if status is not None
                      else ("never-started" if self.generation == 0 else "unknown")),
            "status_generation": status.generation if status is not None else None,
            "alive": self.alive,
            "heartbeat_age_s": None if self.heartbeat_age is None else round(self.heartbeat_age, 3),
            "max_heartbeat_age_s": self.max_heartbeat_age,
            "last_batch": status.last_batch if status is not None else None,
            "error": status.error if status is not None else None,
            "airflow_try": (None if current is None or current.airflow is None
                            else current.to_json()["airflow"]),
            "counts": self.counts.to_json(),
            "latest_completed": None if latest is None else latest.to_json(),
            "latest_completed_age_s": self.age_of_latest(),
            "latest_failed": None if failed is None else failed.to_json(),
            "last_failure_at": self.last_failure_at,
            "latest_savepoint": None if savepoint is None else savepoint.to_json(),
            "latest_restore": None if restore is None else restore.to_json(),
            "summary": {name: None if stat is None else stat.to_json() for name, stat in (
                ("duration_ms", self.duration_ms), ("bytes_copied", self.bytes_copied),
                ("bytes_total", self.bytes_total))},
            "config": dict(self.config),
            "checkpoints": [r.to_json() for r in self.checkpoints],
            "savepoints": [r.to_json() for r in self.savepoints],
            "generations": [g.to_json() for g in self.generations],
            "requests": [r.to_json() for r in self.requests],
            "staged": [t.to_json() for t in self.staged],
            "cutovers": [c.to_json() for c in self.cutovers],
            "dag_ids": self.dag_ids,
            "trend": [p.as_dict() for p in (self.counters.trend if self.counters is not None else ())],
        }


def load_history(
    catalog: Catalog,
    *,
    max_heartbeat_age: float = 60.0,
    generations: int = GENERATIONS_SHOWN,
    now: float | None = None,
    savepoints: bool = True,
) -> PipelineHistory:
    """Read the whole history of `catalog`'s job (see the module docstring for the cost);
    without `savepoints`, every part but the savepoints (kept until deleted by hand or by
    `SparkpointSavepointOperator`'s retention: the one part that grows with a job's age
    unless told otherwise), for `services.health.load_for_metrics`.

    :raises StorageError: the store cannot be listed.
    """
    now = time.time() if now is None else now
    status, current = current_status(catalog)
    alive, age = liveness(status, current, max_heartbeat_age, now=now)
    return PipelineHistory(
        job=catalog.job,
        root=catalog.uri,
        generated_at=now,
        generation=current,
        status=status,
        alive=alive,
        heartbeat_age=age,
        max_heartbeat_age=max_heartbeat_age,
        checkpoints=tuple(snapshot_records(catalog, "checkpoint")),
        savepoints=tuple(snapshot_records(catalog, "savepoint")) if savepoints else (),
        generations=tuple(generation_records(catalog, limit=generations, status=status, current=current)),
        counters=read_counters(catalog),
        requests=tuple(open_requests(catalog)),
        staged=tuple(staged_transactions(catalog)),
        cutovers=tuple(CutoverStore(catalog).newest(CUTOVERS_SHOWN)),
    )
