"""`SparkpointCutoverTrigger`: the deferred half of a deferrable `SparkpointCutoverOperator`,
run by the triggerer. It waits through one phase of a zero-downtime cutover
(`services.zero_downtime`: green's warm-up, blue's stop after N, green's claim, green's
first commit) with the same read-only `look` the blocking path polls, and yields one
event as soon as a look asks for more than waiting: the task resumes on a worker, looks
again itself and acts there (the agreement with blue's ``stop_after`` request, the
call-off, the next phase). The trigger writes nothing, except `on_kill`'s call-off.

Budget: one look every `poll_interval` seconds (10 s at least, jittered upwards only), as
`SparkpointRunTrigger`; the wait never passes the phase's deadline, so a bound is seen
on time.

Its one event::

    {"status": "look", "cutover_id": ..., "phase": ..., "action": ..., "message": "..."}
    {"status": "timeout" | "error", "cutover_id": ..., "message": "..."}

``timeout``: the task's ``execution_timeout`` passed (Airflow does not apply it while a
task is deferred; the worker calls the cutover off unless green claimed, as a killed
blocking task does). ``error``: the records could not be read (the worker reads them
again and says why).

Stopping: `on_kill` (Airflow 3.3+, a user marked the task failed or success, or cleared
it) calls the cutover off unless green claimed it, unless the task instance is still
``deferred`` (the trigger only moved to another triggerer); before 3.3 `cleanup` of a
trigger cancelled before it fired does the same (`triggers.run.NATIVE_ON_KILL`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, ClassVar

from airflow.triggers.base import TriggerEvent

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError, SparkpointError, StorageError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.services.cutover import call_off
from airflow_sparkpoint.services.stores import Catalog, scrub
from airflow_sparkpoint.services.zero_downtime import CutoverLook, DrivePosition, look
from airflow_sparkpoint.triggers.run import (
    MIN_POLL_INTERVAL_S,
    StoppableTrigger,
    run_shielded,
    still_deferred,
    task_instance_state,
)
from airflow_sparkpoint.triggers.shared import (
    MAX_LOOK_ERRORS,
    next_wait,
    open_catalog,
    release_catalog,
    run_blocking,
)

__all__ = ["CLASSPATH", "TASK_ENDED", "SparkpointCutoverTrigger"]

CLASSPATH = "airflow_sparkpoint.triggers.cutover.SparkpointCutoverTrigger"
#: the task states in which no try of the cutover task drives the cutover on: only then
#: does a stopped trigger call it off (a resumed, retried or cleared try resumes the drive
#: from the cutover's records; before Airflow 3.3, a duplicate copy of a trigger that
#: fired is cancelled while its task runs on)
TASK_ENDED = frozenset({"failed", "success", "skipped", "upstream_failed", "removed"})


class SparkpointCutoverTrigger(StoppableTrigger):
    """Wait in phase `position` of cutover `cutover_id` of job `job_name` until a look asks
    the worker to act, a bound passes, or the task's `deadline`.

    :param job_name: blue's pipeline.
    :param cutover_id: the planned cutover.
    :param position: where the drive stands (`DrivePosition.to_json`).
    :param checkpoint_dir: storage root; or `sparkpoint_conn_id` (resolved in the triggerer).
    :param sparkpoint_conn_id: a ``sparkpoint`` connection.
    :param task: the task instance (``dag_id``, ``task_id``, ``run_id``, ``map_index``)
        whose state `on_kill` asks first.
    :param poll_interval: seconds between looks (>= `MIN_POLL_INTERVAL_S`).
    :param max_heartbeat_age: blue runs iff its heartbeat is younger than this.
    :param deadline: epoch seconds (the task's ``execution_timeout``); None: none.
    :param requested_by: who `on_kill`'s call-off names.
    :param call_off_on_kill: call the cutover off when the user stops the task.
    :raises ConfigError: a parameter is invalid (names it).
    """

    #: how `on_kill` asks the task instance's state (a seam: the triggerer's API)
    state_of: ClassVar[Callable[..., Any]] = staticmethod(task_instance_state)

    def __init__(self, *, job_name: str, cutover_id: str, position: dict[str, Any],
                 checkpoint_dir: str | None = None, sparkpoint_conn_id: str | None = None,
                 task: dict[str, Any] | None = None,
                 poll_interval: float | timedelta | str = MIN_POLL_INTERVAL_S,
                 max_heartbeat_age: float | timedelta | str = 60.0, deadline: float | None = None,
                 requested_by: str = "SparkpointCutoverTrigger", call_off_on_kill: bool = True) -> None:
        super().__init__()
        if not isinstance(job_name, str) or not job_name:
            raise ConfigError(f"job_name={job_name!r} is invalid; expected a job name")
        if not isinstance(cutover_id, str) or not cutover_id:
            raise ConfigError(f"cutover_id={cutover_id!r} is invalid; expected a planned cutover's id")
        self.position = DrivePosition.from_json(position)
        self.poll_interval = durations.seconds("poll_interval", poll_interval)
        if self.poll_interval < MIN_POLL_INTERVAL_S:
            raise ConfigError(f"poll_interval={poll_interval!r} is too short; expected at least "
                              f"{MIN_POLL_INTERVAL_S:.0f} s (the triggers' store budget)")
        self.max_heartbeat_age = durations.seconds("max_heartbeat_age", max_heartbeat_age)
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                     or not math.isfinite(deadline)):
            raise ConfigError(f"deadline={deadline!r} is invalid; expected epoch seconds or None")
        if task is not None and not (isinstance(task, dict) and all(
                isinstance(task.get(k), str) for k in ("dag_id", "task_id", "run_id"))):
            raise ConfigError(f"task={task!r} is invalid; expected dag_id, task_id, run_id and map_index")
        self.job_name, self.cutover_id = job_name, cutover_id
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self.waiting_task = None if task is None else {**task, "map_index": int(task.get("map_index", -1))}
        self.deadline = None if deadline is None else float(deadline)
        self.requested_by = str(requested_by)
        self.call_off_on_kill = bool(call_off_on_kill)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "job_name": self.job_name, "cutover_id": self.cutover_id, "position": self.position.to_json(),
            "checkpoint_dir": self.checkpoint_dir, "sparkpoint_conn_id": self.sparkpoint_conn_id,
            "task": self.waiting_task, "poll_interval": self.poll_interval,
            "max_heartbeat_age": self.max_heartbeat_age, "deadline": self.deadline,
            "requested_by": self.requested_by, "call_off_on_kill": self.call_off_on_kill,
        }

    def _event(self, status: str, message: str, **more: Any) -> TriggerEvent:
        return TriggerEvent({"status": status, "cutover_id": self.cutover_id, "phase": self.position.phase,
                             "message": scrub(message), **more})

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        errors, shown = 0, ""
        while True:
            now = time.time()
            if self.deadline is not None and now >= self.deadline:
                yield self._event("timeout", f"cutover {self.cutover_id} of job {self.job_name!r} was "
                                  f"still in phase {self.position.phase} at the task's execution_timeout")
                return
            try:
                if self._catalog is None:
                    self._store_key, self._catalog = await open_catalog(self.job_name, self.checkpoint_dir,
                                                                        self.sparkpoint_conn_id)
                seen = await run_blocking(self._look, self._catalog, now)
                errors = 0
            except StorageError as exc:
                errors += 1
                self.log.warning("look %d at cutover %s failed: %s", errors, self.cutover_id, exc)
                if errors >= MAX_LOOK_ERRORS:
                    yield self._event("error", f"storage of job {self.job_name!r} unreachable ({errors} "
                                      f"looks in a row): {exc}")
                    return
                seen = None
            except SparkpointError as exc:  # ended, agreed elsewhere, unreadable: the worker says which
                yield self._event("error", str(exc))
                return
            if seen is not None and seen.progress_seen is not None:  # the next look measures from it
                self.position = replace(self.position, progress_seen=seen.progress_seen)
            if seen is not None and seen.action != "wait":
                yield self._event("look", seen.line, action=seen.action)
                return
            if seen is not None and seen.line != shown:
                shown = seen.line
                self.log.info("cutover %s: %s", self.cutover_id, seen.line)
            await asyncio.sleep(self._interval(now))

    def _look(self, catalog: Catalog, now: float) -> CutoverLook:
        return look(catalog, self.cutover_id, self.position, max_heartbeat_age=self.max_heartbeat_age,
                    now=now)

    def _interval(self, now: float) -> float:
        """The next wait: jittered upwards only, never past the phase's bound or the task's
        deadline (a bound is looked at as it passes)."""
        ends = [self.position.deadline] + ([self.deadline] if self.deadline is not None else [])
        return next_wait(self.poll_interval, min(end - now for end in ends), upwards_only=True)

    async def on_kill(self) -> None:
        """A user acted on the task (Airflow 3.3+): call the cutover off unless green
        claimed it, only when the task ended (`TASK_ENDED`: marked failed or success, ...;
        a cleared or retried try resumes the drive instead). Shielded (`run_shielded`)."""
        if not self.call_off_on_kill:
            return
        await run_shielded(self._call_off_unless_deferred())

    async def _call_off_unless_deferred(self) -> None:
        task = self.waiting_task
        if task is not None and await still_deferred(task, self.state_of, self.log,
                                                     f"cutover {self.cutover_id} of job {self.job_name}",
                                                     ended=TASK_ENDED):
            return
        key, catalog = await open_catalog(self.job_name, self.checkpoint_dir, self.sparkpoint_conn_id)
        try:
            await run_blocking(self._call_off, catalog)
        finally:
            await release_catalog(key)

    def _call_off(self, catalog: Catalog) -> None:
        try:
            end = call_off(catalog, self.cutover_id, by=self.requested_by,
                           reason=f"task {(self.waiting_task or {}).get('task_id', '?')} was stopped while "
                                  "deferred on it")
        except SparkpointError as exc:  # green claimed (then it is green's), or unreadable: said, not raised
            self.log.warning("cutover %s not called off: %s", self.cutover_id, exc)
            return
        self.log.info("cutover %s: %s at %s", end.id, end.outcome, end.step)


