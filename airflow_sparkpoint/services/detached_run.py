"""The detached run a deferrable submit task follows (``deferrable=True``; cluster mode
too): its record in the task state store (`DetachedRecord`), whether a resumption of the
task follows its own live run again instead of starting a new generation (`resumption`),
and what the trigger's one event about the run's end says (`event_problem`, `run_end`);
what a clear of the task does (`user_stop_by`, `cleared_stop`, `followed_end`,
`stop_cleared_run`, `wait_out_stopping_run`):
the trigger of the cleared try cancels the run, and the new try starts the job again,
whether it looked before that cancel (it re-attached; the run then ends ``stopped``) or
after it (it waits for the dying run's end). Pure Python: no Spark, no Airflow (the front
end passes the store and its retention).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, GenerationInfo
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.exceptions import ConfigError, ControlError
from airflow_sparkpoint.services.cluster_manager import cluster_record
from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.follow import (
    EVENT_STATUSES,
    DriverHandle,
    RunFollower,
    reattach_target,
    stop_run,
    stopping_target,
)

__all__ = ["CLAIM_TIMEOUT_S", "DETACHED_KEY", "USER_STOP", "DetachedRecord", "Resumption", "RunEnd",
           "cleared_stop", "event_problem", "followed_end", "resumption", "run_end", "stop_cleared_run",
           "user_stop_by", "wait_out_stopping_run"]

#: the task state store key of the detached run's record
DETACHED_KEY = "sparkpoint_detached"
#: how long the task waits for the detached driver's generation claim before it gives up
CLAIM_TIMEOUT_S = 600.0
#: the ``requested_by`` of the cancel a trigger writes when a user stopped its task (mark
#: failed or success, clear); `user_stop_by` adds which task try's trigger wrote it
USER_STOP = "SparkpointRunTrigger (the task was stopped)"


class DetachedRecord(dict):  # type: ignore[type-arg]
    """The detached run a task follows, as kept in the task state store:
    ``generation``, ``token``, ``since``, ``deadline``, ``deferred_try`` (the try that last
    deferred on the run, when known: a later try that finds it live was cleared while
    deferred, `cleared_while_deferred`) and where the driver runs: ``process``
    (`DriverProcess.to_json`, client mode) or ``cluster`` (cluster mode: ``driver``,
    `ClusterDriver.to_json`, and ``conn_id``, the Spark connection whose cluster manager
    watches and kills it)."""

    @classmethod
    def load(cls, store: Any) -> DetachedRecord | None:
        """The record in `store` (None: no store, no record or an unreadable one)."""
        if store is None:
            return None
        try:
            raw = store.get(DETACHED_KEY)
            raw = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(raw, dict) or not isinstance(raw.get("generation"), (int, type(None))):
                return None
            if raw.get("cluster") is not None:
                cluster_record(raw["cluster"])
            else:
                DriverProcess.from_json(raw.get("process"))
            return cls(raw)
        except (ConfigError, ValueError, TypeError, AttributeError, KeyError):
            return None
        except Exception:  # noqa: BLE001 - the store's transport: bookkeeping never fails the run
            return None

    def save(self, store: Any, log: Any, *, retention: Any = None) -> None:
        """Write the record to `store` (nothing without one), kept for `retention` (the
        store's never-expiring one: a streaming job outlives its default); a failure is
        `log`ged as a warning."""
        if store is None:
            return
        try:
            store.set(DETACHED_KEY, dict(self), retention=retention)
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            log.warning("could not write the task state record %r: %s", DETACHED_KEY, exc)

    def claimed(self, generation: int) -> DetachedRecord:
        """This record once its driver claimed `generation`."""
        return DetachedRecord({**self, "generation": generation})

    def deferring(self, generation: int, try_number: int) -> DetachedRecord:
        """This record once try `try_number` defers on run `generation`."""
        return DetachedRecord({**self, "generation": generation, "deferred_try": try_number})

    def cleared_while_deferred(self, generation: int, try_number: int) -> int | None:
        """The earlier try that deferred on run `generation` when try `try_number` of the
        same task finds that run live, else None. A deferred try ends only by a user's
        action (a clear; a mark-failed or -success stops the run): the triggerer keeps a
        deferred task deferred across its restarts, and its trigger has no timeout."""
        deferred = self.get("deferred_try")
        if self.get("generation") != generation or isinstance(deferred, bool) \
                or not isinstance(deferred, int):
            return None
        return deferred if deferred < try_number else None


@dataclass(frozen=True)
class Resumption:
    """A resumed task's own live run, followed again: its `generation`, the submit
    `token` and the generation `since` its run is looked for after, the `deadline` of
    the task, where its driver runs (a detached `process`, a `cluster` record, or
    neither: not recorded), its generation `claim` (None: unreadable) and `cleared`: the
    earlier try of the task that deferred on it (`DetachedRecord.cleared_while_deferred`:
    the task was cleared; the run is stopped and the job started again), else None."""

    generation: int
    token: str
    since: int
    deadline: float | None
    process: DriverProcess | None
    cluster: Mapping[str, Any] | None
    claim: GenerationInfo | None
    cleared: int | None = None


def resumption(catalog: Catalog, starter: AirflowTry, *, own: Sequence[int] | None,
               record: DetachedRecord | None, dead_after: float,
               deadline: Callable[[], float | None]) -> Resumption | None:
    """The task's own live run that a resumption (a retry, a worker lost before it
    deferred) follows again, or None: start a new generation (`follow.reattach_target`:
    live, started by this task instance, one of `own`, no stop or cancel addressed to it).
    Where its driver runs, its token and deadline come from the task's `record` when that
    names this run (by generation, or, a worker lost before the claim came, by the submit
    token its claim records); else the token is the claim's and the `deadline` a new one.

    :raises StorageError: the store cannot be read.
    """
    status = reattach_target(catalog, starter, own=own, max_heartbeat_age=dead_after)
    if status is None:
        return None
    process = cluster = None
    token, since, until = "", status.generation - 1, deadline()
    claim = catalog.generation_claim(status.generation)
    if record is not None and (record["generation"] == status.generation or (
            claim is not None and record.get("token") and claim.submitter == record.get("token"))):
        if record.get("cluster") is not None:
            cluster = record["cluster"]
        else:
            process = DriverProcess.from_json(record["process"])
        token, since = str(record.get("token") or ""), int(record.get("since") or since)
        until = record.get("deadline") if isinstance(record.get("deadline"), (int, float)) else until
    if claim is not None:
        token = token or claim.submitter
    cleared = None if record is None else record.cleared_while_deferred(status.generation,
                                                                        starter.try_number or 1)
    return Resumption(status.generation, token, since, until, process, cluster, claim, cleared)


def event_problem(event: Any, generation: int) -> str | None:
    """What is wrong with the trigger's `event` (untrusted input), or None: a mapping with a
    known status (`follow.EVENT_STATUSES`), for `generation`."""
    if not isinstance(event, Mapping):
        return f"malformed Sparkpoint run event {event!r}: expected a dict"
    if event.get("status") not in EVENT_STATUSES:
        return (f"malformed Sparkpoint run event {dict(event)!r}: status "
                f"{event.get('status')!r}, expected one of {', '.join(EVENT_STATUSES)}")
    if event.get("generation") != generation:
        return (f"Sparkpoint run event {dict(event)!r} is for generation "
                f"{event.get('generation')!r}; this task follows generation {generation}")
    return None


@dataclass(frozen=True)
class RunEnd:
    """How a followed run ended, from a valid event: its `status` (`follow.EVENT_STATUSES`,
    or ``cleared``: `followed_end`), the task's error `message` when it did not succeed (for
    ``cleared``: the log line), and `notes` for the task log (where the driver's output is)."""

    status: str
    message: str = ""
    notes: list[str] = field(default_factory=list)


def run_end(event: Mapping[str, Any], *, job: str, generation: int) -> RunEnd:
    """The end of run `generation` of `job` that a valid `event` reports (`event_problem`)."""
    message = str(event.get("message") or "")
    notes = []
    if event["status"] != "success" and isinstance(event.get("log"), str) and event.get("log"):
        notes.append(f"the detached driver's output is {event['log']} on host {event.get('host') or '?'}")
    if event["status"] != "success" and isinstance(event.get("driver"), str) and event.get("driver"):
        notes.append(f"the driver ran on the cluster as {event['driver']} (its log is the cluster's)")
    if event["status"] == "timeout":
        return RunEnd("timeout", message or f"job {job!r} generation {generation} timed out", notes)
    if event["status"] == "dead":
        bound = event.get("dead_after")
        bound_text = f"{bound:.0f}" if isinstance(bound, (int, float)) else "?"
        return RunEnd("dead", message or f"the driver of job {job!r} generation {generation} is "
                                         f"silent for more than {bound_text} s: declared dead", notes)
    if event["status"] == "failed":
        return RunEnd("failed", f"job {job!r} generation {generation} failed: {message}", notes)
    return RunEnd("success", "", notes)


def followed_end(catalog: Catalog, event: Mapping[str, Any], *, job: str, generation: int,
                 starter: AirflowTry) -> RunEnd:
    """`run_end` for the run `generation` that try `starter` followed; a run that ended
    ``stopped`` by the cancel of a cleared earlier try's trigger (`cleared_stop`) is not
    the task's end: ``cleared``, the task starts the job again, as a cleared task does.

    :raises StorageError: the store cannot be read.
    """
    end = run_end(event, job=job, generation=generation)
    if end.status != "success" or event.get("state") != "stopped":
        return end
    cleared = cleared_stop(catalog, generation, starter)
    if cleared is None:
        return end
    line = (f"job {job} generation {generation}, which this try re-attached to, was cancelled by the trigger "
            f"of the cleared earlier try ({cleared.requested_by}, request {cleared.id}): starting the job "
            f"again, as a cleared task does")
    return RunEnd("cleared", line, end.notes)


def stop_cleared_run(catalog: Catalog, run: Resumption, driver: DriverHandle | None, *, job: str,
                     task: Mapping[str, Any], wait_s: float, log: Any) -> None:
    """Stop `run`, on which try `run.cleared` of the task (`task`: the trigger's form, as
    `user_stop_by` reads it) deferred before it was cleared: what that try's trigger's
    ``on_kill`` does (a cancel naming the cleared try, `wait_s` for the end, then
    `driver`'s kill), which leaves a run whose task is deferred again alone; each step is
    `log`ged. Never raises for the run's outcome (`follow.stop_run`)."""
    by = user_stop_by({**task, "try_number": run.cleared})
    log.info("job %s generation %d, on which try %d of this task deferred, is live: the task was cleared; "
             "stopping it and starting the job again, as a cleared task does", job, run.generation,
             run.cleared)
    for line in stop_run(catalog, run.generation, driver, wait_s=wait_s, exit_s=2.0, requested_by=by):
        log.info("stopping job %s: %s", job, line)


def _instance(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    mapped = f"[{map_index}]" if map_index is not None and map_index >= 0 else ""
    return f"{USER_STOP} by task instance {dag_id}.{task_id}{mapped} of DAG run {run_id}"


def user_stop_by(task: Mapping[str, Any]) -> str:
    """The ``requested_by`` of the cancel the trigger of task try `task` (the trigger's
    ``task``: ``dag_id``, ``task_id``, ``run_id``, ``map_index``, ``try_number`` when known)
    writes when a user stopped that task: `USER_STOP`, the task instance and the try
    (`cleared_stop` reads it back)."""
    text = _instance(str(task["dag_id"]), str(task["task_id"]), str(task["run_id"]),
                     int(task.get("map_index", -1)))
    number = task.get("try_number")
    return text if not isinstance(number, int) or isinstance(number, bool) else f"{text}, try {number}"


def _earlier_try(request: ControlRequest, starter: AirflowTry) -> bool:
    """Whether `request` is the cancel of a trigger of an earlier try of `starter`'s task
    instance (`user_stop_by`)."""
    prefix = _instance(starter.dag_id, starter.task_id, starter.run_id, starter.map_index) + ", try "
    number = request.requested_by[len(prefix):] if request.requested_by.startswith(prefix) else ""
    return (request.kind == "cancel" and number.isdigit() and starter.try_number is not None
            and int(number) < starter.try_number)


def cleared_stop(catalog: Catalog, generation: int, starter: AirflowTry) -> ControlRequest | None:
    """The served cancel that ended run `generation`, when the trigger of an *earlier* try
    of `starter`'s task instance wrote it (`user_stop_by`): the task was cleared while
    `starter` already followed the run, and `starter` starts the job again. None when no
    such request completed (a stop asked of this try, a savepoint's stop, another cause).

    :raises StorageError: the store cannot be read.
    """
    channel = ControlChannel(catalog)
    for request_id in reversed(channel.request_ids()):
        try:
            request = channel.read_request(request_id)
            if request.generation == generation and _earlier_try(request, starter) and \
                    channel.result(request_id).state == "completed":
                return request
        except ControlError:
            continue  # an unreadable request is no clear's
    return None


def wait_out_stopping_run(catalog: Catalog, starter: AirflowTry, *, own: Sequence[int] | None,
                          record: DetachedRecord | None, dead_after: float, poll_s: float = 1.0,
                          sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Wait for the end of the task's own live run that a stop or cancel is ending
    (`follow.stopping_target`: e.g. the cleared try's trigger cancelled it before this
    try looked), so that this try's start never runs beside it: until its status records
    an end, a newer generation fences it, its recorded driver (the task's `record`, when it
    names that run) is gone, or it is silent for `dead_after` (`RunFollower`). Returns what
    was waited for, as log lines (none: no such run).

    :raises StorageError: the store cannot be read.
    """
    status = stopping_target(catalog, starter, own=own, max_heartbeat_age=dead_after)
    if status is None:
        return []
    process = None
    if record is not None and record["generation"] == status.generation and record.get("cluster") is None:
        process = DriverProcess.from_json(record["process"])
    started = time.monotonic()
    event = RunFollower(catalog, status.generation, dead_after, process).until_ended(poll_s, sleep=sleep)
    waited = time.monotonic() - started
    line = (f"generation {status.generation} of job {catalog.job!r}, started by this task instance, is "
            f"being stopped (a stop or cancel is addressed to it): waited {waited:.1f} s for its end "
            f"({event.get('state') or event['status']}) before starting a new generation")
    return [line]
