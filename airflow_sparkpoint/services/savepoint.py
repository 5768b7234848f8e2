"""Take a savepoint of a job (or stop it with one): the one home of this use case, for
`sparkpoint savepoint` and `SparkpointSavepointOperator`.

`take_savepoint` is the whole use case; its steps, for a caller that waits elsewhere
(the operator's trigger)::

    source = savepoint_source(catalog, max_heartbeat_age)
    if source.run is not None:                      # a live run: ask it
        request = request_savepoint(catalog, source.run, stop=..., timeout_s=..., requested_by=...)
        result = wait_for_savepoint(catalog, request, timeout_s=..., poll_s=..., max_heartbeat_age=...)
    else:                                           # none: copy its latest completed checkpoint
        latest, handle = savepoint_from_latest_checkpoint(catalog, source, refused_by=None)
    keep_savepoint_history(catalog, max_count=..., max_age_s=...)   # after success, if asked

The request names the live run's generation, so only that run serves it; waiting gives
up as soon as that run is no longer live (`history.generation_alive`). The requester
never cleans up finished requests: the running job does (`ControlChannel.cleanup`, at
its control poll). Callers turn the `SparkpointError`s raised here into their own
failures (an exit code, an `AirflowException`). Pure Python over a `Catalog`: no Spark,
no Airflow.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.history import current_status, generation_alive, liveness
from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.exceptions import CatalogError, ControlError, SparkpointError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import SnapshotHandle
    from airflow_sparkpoint.checkpoints.control_records import ControlRequest, ControlResult
    from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata

__all__ = [
    "Savepoint", "SavepointSource", "keep_savepoint_history", "request_savepoint", "requester",
    "savepoint_from_latest_checkpoint", "savepoint_source", "take_savepoint", "wait_for_savepoint",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavepointSource:
    """Where a savepoint of `job` comes from: its live run (`run`), or, with none, its
    latest completed checkpoint. `status` is the status record read (None: none yet)."""

    job: str
    status: JobStatus | None
    run: JobStatus | None
    heartbeat_age: float | None

    def why_not_running(self) -> str:
        """E.g. 'has no live run (last state failed, generation 2, heartbeat 75 s old)'."""
        if self.status is None:
            return "has no live run (no status record)"
        return (f"has no live run (last state {self.status.state}, generation {self.status.generation}, "
                f"heartbeat {self.heartbeat_age or 0.0:.0f} s old)")


def savepoint_source(catalog: Catalog, max_heartbeat_age: float) -> SavepointSource:
    """Whether `catalog`'s job has a live run to ask for a savepoint (`history.liveness`:
    running, a heartbeat younger than `max_heartbeat_age`, not superseded)."""
    status, generation = current_status(catalog)  # status first: a record older than a claim shows as such
    alive, age = liveness(status, generation, max_heartbeat_age)
    return SavepointSource(catalog.job, status, status if alive else None, age)


def request_savepoint(catalog: Catalog, run: JobStatus, *, stop: bool, timeout_s: float,
                      requested_by: str) -> ControlRequest:
    """File a ``savepoint`` (or, with `stop`, a ``stop``: stop-with-savepoint) request
    for the live run `run` only; it expires after `timeout_s`.

    :raises ConfigError: a non-positive `timeout_s`.
    :raises StorageError: the request could not be written.
    """
    return ControlChannel(catalog).submit("stop" if stop else "savepoint", timeout_s=timeout_s,
                                          generation=run.generation, requested_by=requested_by)


def wait_for_savepoint(catalog: Catalog, request: ControlRequest, *, timeout_s: float, poll_s: float,
                       max_heartbeat_age: float) -> ControlResult:
    """Block until the run `request` names completes it; return the result (with the
    savepoint URI and batch).

    :raises ControlError: the request failed or expired, `timeout_s` passed, the run is
        no longer live (died, stopped or superseded), or it completed without a savepoint.
    """
    generation = request.generation

    def is_alive() -> bool:
        return generation_alive(catalog, generation, max_heartbeat_age)

    result = ControlChannel(catalog).wait(request.id, timeout_s=timeout_s, poll_s=poll_s, is_alive=is_alive)
    if not result.savepoint:
        raise ControlError(f"{request.kind} request {request.id} of job {catalog.job!r} completed without a "
                           "savepoint path")
    return result


def savepoint_from_latest_checkpoint(
    catalog: Catalog,
    source: SavepointSource,
    *,
    refused_by: str | None,
    stop: bool = False,
    announce: Callable[[str], None] | None = None,
) -> tuple[SnapshotMetadata, SnapshotHandle]:
    """Copy the latest completed checkpoint of a job with no live run (`source`) into a
    savepoint; return (that checkpoint, the savepoint).

    :param refused_by: the caller's setting that forbids this (e.g.
        ``"--no-from-checkpoint"``), or None when it is allowed.
    :param stop: a stop-with-savepoint was asked for (there is nothing to stop).
    :param announce: called with one line saying which checkpoint is copied, before the copy.
    :raises CatalogError: refused (`refused_by`), or the job has no completed checkpoint.
    :raises SparkpointError: the copy failed (nothing was made into a savepoint).
    """
    why = source.why_not_running()
    if refused_by is not None:
        raise CatalogError(
            f"job {catalog.job!r} {why}; no running job to take a savepoint, and "
            f"{refused_by} refuses to make one "
            "from the latest completed checkpoint"
        )
    latest = catalog.latest()
    if latest is None:
        raise CatalogError(
            f"job {catalog.job!r} {why} and has no completed checkpoint under "
            f"{catalog.uri}; nothing to savepoint "
            "(see `sparkpoint list`)"
        )
    if announce is not None:
        announce(f"job {catalog.job!r} {why}{'; nothing to stop' if stop else ''}; "
                 "making a savepoint from its "
                 f"latest completed checkpoint chk-{latest.id} (batch {latest.batch_id})")
    return latest, catalog.create_savepoint(catalog.handle(latest))


@dataclass(frozen=True)
class Savepoint:
    """What `take_savepoint` did. `source` is ``running-job`` (a request to the live run:
    `request_id`; `state` ``pending`` when not waited for, else the request's final state)
    or ``checkpoint`` (a copy of the latest completed checkpoint `checkpoint_id`, at
    `checkpoint_uri`). `uri` is the savepoint (None while pending)."""

    source: str
    state: str
    generation: int | None
    uri: str | None
    batch_id: int | None
    request_id: str | None = None
    checkpoint_id: int | None = None
    checkpoint_uri: str | None = None


def take_savepoint(
    catalog: Catalog,
    *,
    stop: bool,
    timeout_s: float,
    poll_s: float,
    max_heartbeat_age: float,
    requested_by: str,
    refused_by: str | None = None,
    wait: bool = True,
    on_request: Callable[[ControlRequest], None] | None = None,
    announce: Callable[[str], None] | None = None,
    max_count: int | None = None,
    max_age_s: float | None = None,
) -> Savepoint:
    """A savepoint of `catalog`'s job (with `stop`, stop-with-savepoint): the live run
    takes it (a request that expires after `timeout_s`, waited for with `poll_s`
    between looks), or, with no live run, it is copied from the latest completed
    checkpoint. Then, when `max_count` or `max_age_s` is given, savepoint history
    retention (`keep_savepoint_history`).

    :param requested_by: who files the request (`requester`).
    :param refused_by: the caller's setting that forbids a savepoint from the latest
        checkpoint, or None when it is allowed.
    :param wait: False returns as soon as the request is filed (state ``pending``; no
        retention: the caller applies it once the savepoint is complete).
    :param on_request: called with the filed request before waiting (so that a caller
        killed while it waits can withdraw it).
    :param announce: called with one line before a copy of the latest checkpoint.
    :raises ControlError: the request failed or expired, `timeout_s` passed, or the run
        is no longer live.
    :raises CatalogError: no live run, and refused or no completed checkpoint.
    :raises SparkpointError: the request could not be filed, or the copy failed.
    """
    source = savepoint_source(catalog, max_heartbeat_age)
    if source.run is None:
        latest, handle = savepoint_from_latest_checkpoint(catalog, source, refused_by=refused_by, stop=stop,
                                                          announce=announce)
        done = Savepoint("checkpoint", "completed", handle.metadata.generation, handle.uri,
                         handle.metadata.batch_id, checkpoint_id=latest.id,
                         checkpoint_uri=catalog.checkpoint_uri(latest.id))
    else:
        request = request_savepoint(catalog, source.run, stop=stop, timeout_s=timeout_s,
                                    requested_by=requested_by)
        if on_request is not None:
            on_request(request)
        if not wait:
            return Savepoint("running-job", "pending", source.run.generation, None, None,
                             request_id=request.id)
        result = wait_for_savepoint(catalog, request, timeout_s=timeout_s, poll_s=poll_s,
                                    max_heartbeat_age=max_heartbeat_age)
        done = Savepoint("running-job", result.state, result.generation, result.savepoint, result.batch_id,
                         request_id=request.id)
    keep_savepoint_history(catalog, max_count=max_count, max_age_s=max_age_s)
    return done


def keep_savepoint_history(catalog: Catalog, *, max_count: int | None, max_age_s: float | None) -> list[str]:
    """After a savepoint: dispose of savepoints beyond the `max_count` newest or older
    than `max_age_s` (`retention.savepoint_history_retention`: the newest, and those the
    job relies on, are kept); nothing when both are None. Returns
    the URIs disposed of. A failure is logged, never raised: the savepoint itself
    succeeded, and failing (and retrying) would only make another."""
    if max_count is None and max_age_s is None:
        return []
    try:
        disposed = savepoint_history_retention(catalog, max_count=max_count, max_age_s=max_age_s)
    except SparkpointError as exc:
        log.warning("savepoint history retention of job %s failed: %s", catalog.job, exc)
        return []
    if disposed:
        log.info("savepoint history retention (max_count=%s, max_age=%s s) disposed of %s", max_count,
                 max_age_s, disposed)
    return disposed


def requester(who: str, *, pid: bool = False) -> str:
    """Who files a control request, as the request records it: ``<who>:<user>@<host>``,
    then ``:<pid>`` with `pid` (e.g. ``sparkpoint-cli:ana@worker-3:4242``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return f"{who}:{user}@{socket.gethostname()}" + (f":{os.getpid()}" if pid else "")
