"""The status record of a job: what the current generation is doing, with a heartbeat.

A run writes its record twice: to ``status.json`` (what pollers read, one GET) and to
``status/<generation>.json``, which no other generation ever writes. A superseded run
(a zombie) checks that it is current before it writes, but its write may land after a
newer claim and replace the newer run's ``status.json`` (storage has no conditional
put); the newer run's own record survives, and readers that find ``status.json`` older
than the current generation read that one (`current_status`, `current_of`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from airflow_sparkpoint.checkpoints import bounded, layout

if TYPE_CHECKING:
    from airflow_sparkpoint.storage.base import Storage

__all__ = ["ERROR_MAX_CHARS", "SCHEMA_VERSION", "STATES", "JobStatus", "StatusSource", "current_of",
           "current_status", "read_job_status", "read_status", "write_status"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
STATES = ("starting", "running", "finished", "stopped", "failed")
#: the longest error a status record carries (a longer one is clipped: the record is bounded)
ERROR_MAX_CHARS = 16 * 1024


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
    #: the run's live location; read back only to resume in place (confined to the work root)
    live_dir: str | None = None
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


def write_status(store: Storage, status: Mapping[str, Any]) -> None:
    """Write `status` as its generation's own record, then as ``status.json`` (its error
    clipped to `ERROR_MAX_CHARS`).

    :raises KeyError: or ValueError: `status` names no integer generation.
    :raises CatalogError: the record would still be over its limits (`layout.limits_of`).
    """
    fields = dict(status)
    if isinstance(fields.get("error"), str):
        fields["error"] = bounded.clip(fields["error"], ERROR_MAX_CHARS)
    key = layout.status_key(int(fields["generation"]))
    body = json.dumps(fields, sort_keys=True).encode()
    bounded.check_writable(body, layout.limits_of(key), key)
    store.put(key, body)
    store.put(layout.STATUS, body)


def read_status(store: Storage, uri: str, generation: int | None = None) -> dict[str, Any] | None:
    """``status.json``, or with `generation` that generation's own record; None when
    there is none or it is unreadable (logged, naming the record).

    :raises StorageError: the store cannot be read.
    """
    key = layout.STATUS if generation is None else layout.status_key(generation)
    return bounded.read_record_or_warn(store, key, bounded.json_object(dict), limits=layout.limits_of(key),
                                       where=f"{uri}/{key}", what="status record")


class StatusSource(Protocol):
    """What `read_job_status` and `current_status` need of a job's catalog (the catalog imports this
    module)."""

    job: str

    def read_status(self, generation: int | None = None) -> dict[str, Any] | None: ...

    def current_generation(self) -> int: ...


def read_job_status(catalog: StatusSource, generation: int | None = None) -> JobStatus | None:
    """The job's status record (the one `generation` wrote, when given), or None when
    there is none (or it is unreadable: logged)."""
    raw = catalog.read_status(generation)
    if raw is None:
        return None
    try:
        return JobStatus.from_json(raw)
    except (TypeError, ValueError) as exc:
        log.warning("status record of job %r is incomplete (%s); treating the job as not running",
                    catalog.job, exc)
        return None


def current_of(catalog: StatusSource, status: JobStatus | None, current: int) -> JobStatus | None:
    """The status record of generation `current`, given `status` read from ``status.json``
    before `current` was listed: when `status` is older than `current` (that run has not
    written yet, or a zombie's heartbeat replaced its record), that generation's own
    record when it exists (one GET, only then), else `status`."""
    if status is not None and status.generation < current:
        return read_job_status(catalog, current) or status
    return status


def current_status(catalog: StatusSource) -> tuple[JobStatus | None, int]:
    """(the status record of the current generation, the current generation). Read in
    this order, so that a record written around a claim is seen as older than the claim
    (`current_of`)."""
    status = read_job_status(catalog)
    current = catalog.current_generation()
    return current_of(catalog, status, current), current
