"""Typed records of what the store holds about one job: retained snapshots, the newest
generations, open control requests and staged transactions. `checkpoints.history`
assembles them into the whole view; read the cost notes there.

Pure Python over a `Catalog`: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.catalog_types import SnapshotSummary
from airflow_sparkpoint.checkpoints.display import iso  # re-exported (history.iso)
from airflow_sparkpoint.checkpoints.run_result import RunResult, read_run_result
from airflow_sparkpoint.checkpoints.status import JobStatus, current_status
from airflow_sparkpoint.checkpoints.verification import read_verification
from airflow_sparkpoint.exceptions import ControlError, CorruptMetadata, StorageError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import GenerationInfo, SnapshotEntry

__all__ = ["AIRFLOW_CONTEXT_ENV", "CONFIG_FIELDS", "GENERATIONS_SHOWN", "AirflowTry", "ControlRecord",
           "GenerationRecord", "SnapshotRecord", "StagedRecord", "airflow_context", "generation_details",
           "generation_records", "iso", "open_requests", "plan_origin", "read_generation", "short_name",
           "snapshot_records", "staged_transactions"]

log = logging.getLogger(__name__)

#: generations shown (timeline, restores, the DAGs that ran the job): the newest ones
GENERATIONS_SHOWN = 20
#: the settings a generation records (`generation_details`) and the page shows
CONFIG_FIELDS = (
    ("trigger", "trigger"),
    ("checkpoint.interval", "checkpoint_interval_s"),
    ("checkpoint.timeout", "checkpoint_timeout_s"),
    ("checkpoint.numRetained", "num_retained"),
    ("checkpoint.tolerableFailures", "tolerable_failures"),
    ("commit.mode", "commit_mode"),
    ("restore", "restore"),
    ("restore.sinkAhead", "restore_sink_ahead"),
    ("stateStore", "state_store"),
)
#: Airflow's task context as the task runner exports it to the environment (and so to a
#: client-mode spark-submit it starts)
AIRFLOW_CONTEXT_ENV = {
    "dag_id": "AIRFLOW_CTX_DAG_ID",
    "task_id": "AIRFLOW_CTX_TASK_ID",
    "run_id": "AIRFLOW_CTX_DAG_RUN_ID",
    "try_number": "AIRFLOW_CTX_TRY_NUMBER",
    # not exported by Airflow: the submit operator sets it for a mapped task
    "map_index": "SPARKPOINT_AIRFLOW_MAP_INDEX",
}
_UNREAD = object()
_URI_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s()]+")


def short_name(uri: str | None) -> str:
    """The last path component of a snapshot URI (``chk-3``, ``savepoint-2-x1y2``);
    ``empty state`` for None."""
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "empty state"



# ---------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class SnapshotRecord:
    """One retained checkpoint or savepoint directory, valid or not (Flink's history row).

    `status`: ``valid``, ``invalid`` (`error` says why) or ``superseded`` (valid, on a
    lineage a later restore of an older snapshot abandoned; `superseded_by` names that
    generation). The metadata fields are None when the snapshot is invalid.
    """

    kind: str
    id: int
    uri: str
    key: str
    status: str
    error: str | None = None
    batch_id: int | None = None
    generation: int | None = None
    created_at: float | None = None
    duration_ms: int | None = None
    bytes_copied: int | None = None
    bytes_total: int | None = None
    file_count: int | None = None
    files_copied: int | None = None
    source_checkpoint: int | None = None
    superseded_by: int | None = None
    state_partitions: int | None = None
    verified_at: float | None = None
    verify_error: str | None = None
    verify_level: str | None = None

    @property
    def valid(self) -> bool:
        return self.status != "invalid"

    @property
    def restorable(self) -> bool:
        """Valid and not superseded: what ``restore=latest`` may choose."""
        return self.status == "valid"

    @classmethod
    def from_entry(cls, entry: SnapshotEntry, catalog: Catalog | None = None) -> SnapshotRecord:
        """The record of a catalog listing entry (with its metadata, or slim: its summary);
        with `catalog`, also its last drill. It keeps figures, never the file list."""
        meta = entry.summary if entry.metadata is None else SnapshotSummary.of(entry.metadata)
        superseded_by = entry.superseded_by
        status = "invalid" if meta is None else ("superseded" if superseded_by is not None else "valid")
        drill = read_verification(catalog.store, entry.key) if catalog is not None else None
        common: dict[str, Any] = {
            "kind": entry.kind, "id": entry.id, "uri": entry.uri, "key": entry.key, "status": status,
            "error": entry.error, "superseded_by": superseded_by,
            "verified_at": drill.verified_at if drill else None,
            "verify_error": drill.error if drill else None, "verify_level": drill.level if drill else None,
        }
        if meta is None:
            return cls(**common)
        return cls(
            **common, batch_id=meta.batch_id, generation=meta.generation, created_at=meta.created_at,
            duration_ms=meta.stats.duration_ms, bytes_copied=meta.stats.bytes_copied,
            bytes_total=meta.total_bytes, file_count=meta.file_count, files_copied=meta.stats.files_copied,
            source_checkpoint=meta.source_checkpoint, state_partitions=meta.state_partitions,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``SNAPSHOT`` object of ``sparkpoint list --json`` (docs/CLI.md)."""
        return {
            "kind": self.kind,
            "id": self.id,
            "uri": self.uri,
            "valid": self.valid,
            "error": self.error,
            "batch_id": self.batch_id,
            "generation": self.generation,
            "created_at": self.created_at,
            "created": iso(self.created_at),
            "duration_ms": self.duration_ms,
            "bytes_copied": self.bytes_copied,
            "bytes_total": self.bytes_total,
            "file_count": self.file_count,
            "source_checkpoint": self.source_checkpoint,
            "status": self.status,
            "superseded_by": self.superseded_by,
            "state_partitions": self.state_partitions,
            "verified_at": self.verified_at,
            "verify_error": self.verify_error,
        }

    def short_reason(self) -> str:
        """``valid``, ``superseded (generation 5)`` or ``INVALID: <why>`` (the path stripped)."""
        if self.status == "superseded":
            return f"superseded (generation {self.superseded_by})"
        if self.valid:
            return "valid"
        reason = str(self.error or "unknown")
        for prefix in (f"{self.uri}/_metadata: ", f"{self.uri}: ", f"{self.uri}/"):
            reason = reason.replace(prefix, "")
        return f"INVALID: {reason}"


def snapshot_records(catalog: Catalog, kind: str = "checkpoint", *,
                     drills: bool = True) -> list[SnapshotRecord]:
    """Every retained ``checkpoint`` or ``savepoint`` directory, newest first (as the
    catalog lists them); with `drills`, each with its last restore drill."""
    if kind not in ("checkpoint", "savepoint"):
        raise ValueError(f"snapshot kind {kind!r} is invalid; expected 'checkpoint' or 'savepoint'")
    entries = (catalog.list_checkpoints(slim=True) if kind == "checkpoint"
               else catalog.list_savepoints(slim=True))
    return [SnapshotRecord.from_entry(e, catalog if drills else None) for e in entries]


# ---------------------------------------------------------------------------- generations


@dataclass(frozen=True)
class AirflowTry:
    """The Airflow task try that started a generation (its client-mode driver inherited
    the task's ``AIRFLOW_CTX_*`` environment)."""

    dag_id: str
    task_id: str = ""
    run_id: str = ""
    try_number: int | None = None
    map_index: int | None = None
    #: False for a record of a release before the map index was recorded: any index matches
    map_index_known: bool = field(default=True, compare=False)

    def describe(self) -> str:
        task = f"{self.dag_id}.{self.task_id}" if self.task_id else self.dag_id
        mapped = f"[{self.map_index}]" if self.map_index is not None else ""
        try_text = f" try {self.try_number}" if self.try_number is not None else ""
        return f"{task}{mapped}{try_text}"

    def same_task(self, other: AirflowTry | None) -> bool:
        """Whether `other` is a try of the same task instance (same DAG, task, DAG run and
        map index): a retry or a clear of it, which takes over its run as it always did."""
        if (other is None
                or (self.dag_id, self.task_id, self.run_id) != (other.dag_id, other.task_id, other.run_id)):
            return False
        return not (self.map_index_known and other.map_index_known) or self.map_index == other.map_index

    @classmethod
    def from_json(cls, data: Any) -> AirflowTry | None:
        if not isinstance(data, Mapping) or not data.get("dag_id"):
            return None
        number = str(data.get("try_number") or "")
        index = str(data.get("map_index") if data.get("map_index") is not None else "")
        return cls(str(data["dag_id"]), str(data.get("task_id") or ""), str(data.get("run_id") or ""),
                   int(number) if number.isdigit() else None, int(index) if index.isdigit() else None,
                   map_index_known="map_index" in data)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AirflowTry | None:
        """The task try that started this process (Airflow exports its context to the
        environment of the task and so of a client-mode spark-submit), or None."""
        return cls.from_json(airflow_context(environ))


def airflow_context(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Airflow's task context from the environment (`AIRFLOW_CONTEXT_ENV`); {} outside a task."""
    env = os.environ if environ is None else environ
    context = {name: env[var] for name, var in AIRFLOW_CONTEXT_ENV.items() if env.get(var)}
    if not context.get("dag_id"):
        return {}
    # recorded even when unmapped (""), so a record without it is known to predate it
    return {**context, "map_index": context.get("map_index", "")}


def generation_details(config: Any = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a starting generation records about itself next to its restore plan:
    ``config`` (the settings in force, `CONFIG_FIELDS`, read from a `SparkpointConfig`)
    and ``airflow`` (the task try that started it, when it runs under Airflow)."""
    details: dict[str, Any] = {}
    if config is not None:
        settings = {}
        for name, attr in CONFIG_FIELDS:
            value = getattr(config, attr, None)
            if value is not None:
                settings[name] = value if isinstance(value, (int, float, bool)) else str(value)
        details["config"] = settings
    context = airflow_context(environ)
    if context:
        details["airflow"] = context
    return details


@dataclass(frozen=True)
class GenerationRecord:
    """One start of the job: what it restored, who started it, how it ended.

    `outcome`: the run result's status (``finished``/``stopped``), else the status
    record's state when this generation wrote it (``running``, ``failed``, ...), else
    ``superseded`` (a newer generation took over before it reported an ending: killed,
    or died) — or ``unknown`` for the newest generation without a status.
    """

    generation: int
    started_at: float | None = None
    host: str = ""
    pid: int | None = None
    restore: str | None = None
    plan: str | None = None
    restored_from: str | None = None
    application_id: str = ""
    airflow: AirflowTry | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    result: RunResult | None = None
    outcome: str = "unknown"
    error: str | None = None

    @property
    def restored(self) -> bool:
        """Whether it started from a snapshot (a checkpoint or savepoint) rather than empty state."""
        return self.restored_from is not None

    @property
    def origin(self) -> str:
        """What it started from, short: ``empty state``, ``chk-4``, ``savepoint-1-x1y2``, ``-``."""
        if self.restored_from:
            return short_name(self.restored_from)
        if self.plan:
            return self.plan.split(" (")[0] if not self.plan.startswith("empty") else "empty state"
        return "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "started_at": self.started_at,
            "started": iso(self.started_at),
            "host": self.host,
            "pid": self.pid,
            "restore": self.restore,
            "plan": self.plan,
            "restored_from": self.restored_from,
            "origin": self.origin,
            "application_id": self.application_id or None,
            "airflow": None if self.airflow is None else {
                "dag_id": self.airflow.dag_id, "task_id": self.airflow.task_id, "run_id": self.airflow.run_id,
                "try_number": self.airflow.try_number, "map_index": self.airflow.map_index,
            },
            "outcome": self.outcome,
            "error": self.error,
            "first_batch": self.result.first_batch if self.result else None,
            "last_batch": self.result.last_batch if self.result else None,
            "committed_batches": list(self.result.committed_batches) if self.result else [],
            "savepoint": self.result.savepoint if self.result else None,
        }


def plan_origin(plan: str | None) -> str | None:
    """The snapshot URI a restore plan's description names, or None (empty state)."""
    if not plan:
        return None
    match = _URI_RE.search(plan)
    return match.group(0).rstrip(".,") if match else None


def _read_result(catalog: Catalog, generation: int) -> RunResult | None:
    try:
        return read_run_result(catalog, generation)
    except (StorageError, CorruptMetadata) as exc:
        log.warning("ignoring the unreadable run result of generation %d of %s: %s", generation, catalog.uri,
                    exc)
        return None


def _read_claim(catalog: Catalog, generation: int) -> GenerationInfo | None:
    try:
        return catalog.generation_claim(generation)
    except (StorageError, CorruptMetadata) as exc:
        log.warning("ignoring the unreadable claim of generation %d of %s: %s", generation, catalog.uri, exc)
        return None


def generation_records(
    catalog: Catalog,
    *,
    limit: int = GENERATIONS_SHOWN,
    status: JobStatus | None | object = _UNREAD,
    current: int | None = None,
) -> list[GenerationRecord]:
    """The newest `limit` generations, newest first (`status`: the job's status record,
    read when not given; `current`: the newest generation, listed when not given)."""
    if status is _UNREAD:
        status, listed = current_status(catalog)
        current = listed if current is None else current
    current = catalog.current_generation() if current is None else current
    return [read_generation(catalog, generation, status=status, current=current)
            for generation in range(current, max(0, current - limit), -1)]


def read_generation(
    catalog: Catalog,
    generation: int,
    *,
    status: JobStatus | None | object = _UNREAD,
    current: int | None = None,
) -> GenerationRecord:
    """The record of one generation (its claim, its run result, the status if it wrote it;
    missing parts are empty)."""
    if status is _UNREAD:
        status, listed = current_status(catalog)
        current = listed if current is None else current
    assert status is None or isinstance(status, JobStatus)
    current = catalog.current_generation() if current is None else current
    claim = _read_claim(catalog, generation)
    details = claim.details if claim is not None else {}
    result = _read_result(catalog, generation)
    plan = claim.plan if claim is not None else None
    origin = details.get("origin")  # a structured origin record, where the runtime writes one
    restored_from = (origin.get("uri") if isinstance(origin, Mapping) else None) or \
        (result.restored_from if result else None) or plan_origin(plan)
    error = None
    if result is not None and result.status:
        outcome = result.status
    elif status is not None and status.generation == generation:
        outcome, error = status.state, status.error
    elif generation < current:
        outcome = "superseded"
    else:
        outcome = "unknown"
    return GenerationRecord(
        generation=generation,
        started_at=claim.started_at if claim is not None else None,
        host=claim.host if claim is not None else "",
        pid=claim.pid if claim is not None else None,
        restore=claim.restore if claim is not None else None,
        plan=plan,
        restored_from=None if not restored_from else str(restored_from),
        application_id=claim.app if claim is not None else "",
        airflow=AirflowTry.from_json(details.get("airflow")),
        config=dict(claim.config) if claim is not None else {},
        result=result,
        outcome=outcome,
        error=error,
    )


# ---------------------------------------------------------------------------- control and staged output


@dataclass(frozen=True)
class ControlRecord:
    """A control request (savepoint, stop, cancel) that has not finished yet."""

    id: str
    kind: str
    state: str  # pending | acknowledged
    generation: int | None
    created_at: float
    deadline: float
    requested_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "state": self.state, "generation": self.generation,
                "created_at": self.created_at, "created": iso(self.created_at), "deadline": self.deadline,
                "requested_by": self.requested_by}


def open_requests(catalog: Catalog) -> list[ControlRecord]:
    """Control requests nobody answered yet (pending or acknowledged), oldest first.
    Finished requests are cleaned up after a day, so this stays small."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    channel = ControlChannel(catalog)
    records = []
    for request_id in channel.request_ids():
        try:
            result = channel.result(request_id)
            if result.finished:
                continue
            request = channel.read_request(request_id)  # cached by result()
        except (ControlError, StorageError) as exc:
            log.warning("ignoring unreadable control request %s of job %r: %s", request_id, catalog.job, exc)
            continue
        records.append(ControlRecord(request.id, request.kind, result.state, request.generation,
                                     request.created_at, request.deadline, request.requested_by))
    return sorted(records, key=lambda r: (r.created_at, r.id))


@dataclass(frozen=True)
class StagedRecord:
    """A sink transaction staged but not yet promoted (nor aborted). Its payload (file
    lists, upload ids) is not carried: only what identifies it."""

    txn_id: str
    batch_id: int
    generation: int
    sink: str
    sink_id: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {"txn_id": self.txn_id, "batch_id": self.batch_id, "generation": self.generation,
                "sink": self.sink,
                "sink_id": self.sink_id, "created_at": self.created_at,
                "created": iso(self.created_at or None)}


def staged_transactions(catalog: Catalog) -> list[StagedRecord]:
    """Recorded sink transactions (a record is deleted once committed or aborted), in batch
    order; read one at a time, each payload (its file list) dropped once read."""
    staged = [StagedRecord(r.txn_id, r.batch_id, r.generation, r.sink, r.sink_id, r.created_at)
              for r in catalog.transaction_log]
    return sorted(staged, key=lambda r: (r.batch_id, r.generation))
