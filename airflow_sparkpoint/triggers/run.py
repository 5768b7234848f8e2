"""`SparkpointRunTrigger`: the deferred half of a deferrable `SparkpointSubmitOperator`,
run by the triggerer. It follows one generation of a job through the catalog only
(`services.follow.RunFollower`: its status record, its heartbeat, whether it was
superseded), never through the driver's process, so a restart of the triggerer, the
scheduler or the worker is not a restart of the job.

Budget: one look (two store requests) every `poll_interval` seconds (10 s by default,
jittered upwards only): at most 12 requests a minute, the checkpoint sensor's budget.

It yields exactly one event (``execute_complete`` validates it)::

    {"status": "success" | "failed" | "dead" | "timeout", "generation": g, "job": ...,
     "message": "...", "dead_after": s, ...}

Stopping: Airflow does not apply ``execution_timeout`` while a task is deferred, so the
trigger owns it (`deadline`): there it stops the run (`services.follow.stop_run`) and
reports ``timeout``. `on_kill` (Airflow 3.3+, a user marked the task failed or success, or
cleared it) stops the run too, unless the task instance is still ``deferred``: then the
trigger was only moved to another triggerer (a stalled triggerer's triggers are
redistributed and cancelled with the user-action message) and the job must go on.
Airflow before 3.3 has no `on_kill`: a user's mark-failed, mark-success or clear cancels the
trigger exactly as a triggerer shutdown does, and `cleanup` (which runs on every exit) is
the only call the trigger gets. There `cleanup` of a trigger that was cancelled before it
fired does what `on_kill` does, with the same question first: a task instance still
``deferred`` (a triggerer restart, a redistribution) keeps its job running.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Collection
from datetime import timedelta
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError, StorageError
from airflow_sparkpoint.hooks.spark_cluster import cluster_handle
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.services.cluster_manager import cluster_record
from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.detached_run import USER_STOP, user_stop_by
from airflow_sparkpoint.services.follow import DriverHandle, RunFollower, stop_run
from airflow_sparkpoint.services.stores import Catalog, scrub
from airflow_sparkpoint.triggers.shared import (
    MAX_LOOK_ERRORS,
    next_wait,
    open_catalog,
    release_catalog,
    run_blocking,
)

__all__ = [
    "CLASSPATH",
    "MIN_POLL_INTERVAL_S",
    "NATIVE_ON_KILL",
    "STATE_TIMEOUT_S",
    "STOP_WAIT_S",
    "SparkpointRunTrigger",
    "StoppableTrigger",
    "run_shielded",
    "still_deferred",
    "task_instance_state",
]

CLASSPATH = "airflow_sparkpoint.triggers.run.SparkpointRunTrigger"
#: whether this Airflow's triggerer calls `BaseTrigger.on_kill` when a user stops the task
#: (3.3+); before, `cleanup` stands in for it
NATIVE_ON_KILL = "on_kill" in vars(BaseTrigger)
#: the shortest poll interval: two requests a look, at most 12 a minute
MIN_POLL_INTERVAL_S = 10.0
#: `on_kill`'s bound on asking the task instance's state (through the triggerer's
#: supervisor and the API server: 9-20 s on the loaded e2e stack, more than 20 s seen, the
#: request not yet at the API server then). Past it the run is left alone (the safe
#: answer), so the bound is generous. The wait and the stop that follows run shielded:
#: Airflow's ``[triggerer] on_kill_timeout`` (30 s) cancels the waiting, not the stop.
STATE_TIMEOUT_S = 45.0
#: how long `on_kill` waits for the run to record its end after the cancel request (the
#: driver reads it within ``control.pollInterval``, 2 s by default), before the kill
STOP_WAIT_S = 6.0


#: the stops `on_kill` started that still run (the event loop keeps only weak references)
_STOPPING: set[asyncio.Future[None]] = set()


async def task_instance_state(dag_id: str, task_id: str, run_id: str, map_index: int) -> str | None:
    """The state of a task instance, asked from the triggerer (Airflow 3's ``GetTaskStates``),
    or None when it is not found."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def ask() -> Any:
        return RuntimeTaskInstance.get_task_states(dag_id=dag_id, task_ids=[task_id], run_ids=[run_id],
                                                   map_index=map_index)

    states = await asyncio.get_running_loop().run_in_executor(None, ask)
    try:
        state = states[run_id][task_id]
    except (KeyError, TypeError):
        return None
    return None if state is None else str(getattr(state, "value", state))


async def still_deferred(task: dict[str, Any], state_of: Callable[..., Any], log: Any, what: str, *,
                         ended: Collection[str] | None = None) -> bool:
    """Whether task instance `task` is still ``deferred`` (its trigger is only moving to
    another triggerer) or its state cannot be read within `STATE_TIMEOUT_S`: either way
    `what` (the job, the cutover) is to be left alone, the safe answer; logged. With
    `ended`, only those states end it: in any other, a try of the task goes on with it."""
    asked = time.monotonic()
    try:
        asking = state_of(task["dag_id"], task["task_id"], task["run_id"], task["map_index"])
        state = await asyncio.wait_for(asking, STATE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - unknown: the safe answer is to leave it be
        log.warning("cannot read the state of task %s (%s), leaving %s as it is", task,
                    exc or type(exc).__name__, what)
        return True
    log.info("task %s is %s (asked in %.1f s)", task["task_id"], state, time.monotonic() - asked)
    if state == "deferred":
        log.info("task %s is still deferred (the trigger moved to another triggerer): %s goes on",
                 task["task_id"], what)
        return True
    if ended is not None and state not in ended:
        log.info("task %s is %s: a try of it goes on with %s", task["task_id"], state, what)
        return True
    return False


async def run_shielded(action: Any) -> None:
    """Await coroutine `action` as a task of its own, shielded: Airflow 3.3's triggerer
    cancels a trigger again at every state sync until it has finished (each time with the
    user-action message), swallows a cancelled `on_kill` and calls `cleanup`; the action
    goes on regardless (the event loop keeps only weak references: `_STOPPING` holds it)."""
    stopping = asyncio.ensure_future(action)
    _STOPPING.add(stopping)
    stopping.add_done_callback(_STOPPING.discard)
    await asyncio.shield(stopping)


class StoppableTrigger(BaseTrigger):
    """A trigger that acts when its task is stopped (`on_kill`) and holds a shared store
    client: `run` remembers a cancellation before it fired, and `cleanup` releases the
    client and, before Airflow 3.3 (no `on_kill` from the triggerer), does what `on_kill`
    does for a trigger cancelled before it fired (a user's stop, or a triggerer's shutdown
    where `on_kill` leaves a task still deferred alone). Subclasses yield from `_events`."""

    waiting_task: dict[str, Any] | None = None
    _store_key: str | None = None
    _catalog: Catalog | None = None
    #: `run` was cancelled before it fired (a user's stop or a triggerer's shutdown)
    _cancelled = False

    def _events(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async for event in self._events():
                yield event
        except asyncio.CancelledError:
            self._cancelled = True
            raise

    async def cleanup(self) -> None:
        try:
            if not NATIVE_ON_KILL and self._cancelled and self.waiting_task is not None:
                await self.on_kill()
        finally:
            key, self._store_key, self._catalog = self._store_key, None, None
            await release_catalog(key)


class SparkpointRunTrigger(StoppableTrigger):
    """Follow generation `generation` of job `job_name` until it ends, dies or times out.

    :param job_name: the pipeline.
    :param generation: the run to follow (>= 1).
    :param checkpoint_dir: storage root; or `sparkpoint_conn_id` (resolved in the triggerer).
    :param sparkpoint_conn_id: a ``sparkpoint`` connection.
    :param process: where a detached client-mode driver runs (`DriverProcess.to_json`), or
        None when unknown (a re-attach without Airflow's task state store): then a stop is a
        control request only.
    :param cluster: where a cluster-mode driver runs: ``{"driver": ClusterDriver.to_json(),
        "conn_id": <Spark connection>}``; the triggerer watches and kills it through that
        connection's cluster manager (`hooks.spark_cluster`), never by a process id.
    :param task: the task instance (``dag_id``, ``task_id``, ``run_id``, ``map_index``) whose
        state `on_kill` checks, and the ``try_number`` that deferred (optional: its stop's
        ``requested_by`` names the try, so that a new try of a cleared task tells the
        stop of the cleared try from one asked of itself).
    :param poll_interval: seconds between looks (>= `MIN_POLL_INTERVAL_S`).
    :param dead_after: a heartbeat older than this on two looks in a row: the driver is dead.
    :param deadline: epoch seconds (the task's ``execution_timeout``) at which the run is
        stopped and the task fails; None: none.
    :param cancel_on_kill: stop the run when the user kills the task (`on_kill`).
    :raises ConfigError: a parameter is invalid (names it).
    """

    #: how `on_kill` asks the task instance's state (a seam: the triggerer's API)
    state_of: ClassVar[Callable[..., Any]] = staticmethod(task_instance_state)

    def __init__(
        self,
        *,
        job_name: str,
        generation: int,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        process: dict[str, Any] | None = None,
        cluster: dict[str, Any] | None = None,
        task: dict[str, Any] | None = None,
        poll_interval: float | timedelta | str = MIN_POLL_INTERVAL_S,
        dead_after: float | timedelta | str = 60.0,
        deadline: float | None = None,
        cancel_on_kill: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
            raise ConfigError(f"generation={generation!r} is invalid; expected an integer >= 1")
        if not isinstance(job_name, str) or not job_name:
            raise ConfigError(f"job_name={job_name!r} is invalid; expected a job name")
        self.poll_interval = durations.seconds("poll_interval", poll_interval)
        if self.poll_interval < MIN_POLL_INTERVAL_S:
            raise ConfigError(f"poll_interval={poll_interval!r} is too short; expected at least "
                              f"{MIN_POLL_INTERVAL_S:.0f} s (two store requests a look, at most 12 a minute)")
        self.dead_after = durations.seconds("dead_after", dead_after)
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                     or not math.isfinite(deadline)):
            raise ConfigError(f"deadline={deadline!r} is invalid; expected epoch seconds or None")
        self.process = None if process is None else DriverProcess.from_json(process)
        self.cluster = None if cluster is None else dict(cluster)
        if self.cluster is not None:
            if self.process is not None:
                raise ConfigError("process and cluster are both given; expected one place of the driver")
            cluster_record(self.cluster)
        if task is not None and not (isinstance(task, dict) and all(
                isinstance(task.get(k), str) for k in ("dag_id", "task_id", "run_id"))):
            raise ConfigError(f"task={task!r} is invalid; expected dag_id, task_id, run_id and map_index")
        if task is not None and task.get("try_number") is not None and (
                isinstance(task["try_number"], bool) or not isinstance(task["try_number"], int)):
            raise ConfigError(f"task={task!r} is invalid; expected try_number to be an integer or absent")
        self.job_name = job_name
        self.generation = generation
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self.waiting_task = None if task is None else {**task, "map_index": int(task.get("map_index", -1))}
        self.deadline = None if deadline is None else float(deadline)
        self.cancel_on_kill = bool(cancel_on_kill)
        self._driver: DriverHandle | None = None

    def driver(self) -> DriverHandle | None:
        """Where the driver runs, as the follower watches and stops it (blocking: a cluster
        manager reads the Spark connection); None when not recorded or its cluster manager
        cannot be built (then a stop is a control request only, and that is logged)."""
        if self._driver is None and self.cluster is not None:
            driver = cluster_record(self.cluster)[0]
            try:
                self._driver = cluster_handle(self.cluster)
            except ConfigError as exc:
                self.log.warning("job %s generation %d: cannot reach the cluster manager of %s (%s): it is "
                                 "followed through the catalog only and stopped by a control request only",
                                 self.job_name, self.generation, driver.describe(), exc)
                return None
        return self._driver if self.cluster is not None else self.process

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "job_name": self.job_name, "generation": self.generation, "checkpoint_dir": self.checkpoint_dir,
            "sparkpoint_conn_id": self.sparkpoint_conn_id,
            "process": None if self.process is None else self.process.to_json(), "cluster": self.cluster,
            "task": self.waiting_task, "poll_interval": self.poll_interval, "dead_after": self.dead_after,
            "deadline": self.deadline, "cancel_on_kill": self.cancel_on_kill,
        }

    async def _acatalog(self) -> Catalog:
        if self._catalog is None:
            self._store_key, self._catalog = await open_catalog(self.job_name, self.checkpoint_dir,
                                                                self.sparkpoint_conn_id)
        return self._catalog

    def _interval(self, remaining: float | None) -> float:
        """The next wait: jittered upwards only (never more looks than the budget), never
        past the deadline."""
        return next_wait(self.poll_interval, remaining, upwards_only=True)

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        follower: RunFollower | None = None
        errors = 0
        while True:
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                catalog = await self._acatalog()
                lines = await run_blocking(self._stop, catalog, "execution_timeout")
                yield TriggerEvent({"status": "timeout", "generation": self.generation, "job": self.job_name,
                                    "message": scrub(f"generation {self.generation} of job {self.job_name!r} "
                                                     f"ran past the task's execution_timeout: "
                                                     + "; ".join(lines))})
                return
            try:
                if follower is None:
                    catalog = await self._acatalog()
                    follower = RunFollower(catalog, self.generation, self.dead_after,
                                           await run_blocking(self.driver))
                event = await run_blocking(follower.look)
                errors = 0
            except StorageError as exc:
                errors += 1
                self.log.warning("look %d at job %s failed: %s", errors, self.job_name, exc)
                if errors >= MAX_LOOK_ERRORS:  # the run may be fine: give the store time
                    yield TriggerEvent({"status": "dead", "generation": self.generation, "job": self.job_name,
                                        "message": scrub(f"storage of job {self.job_name!r} unreachable "
                                                         f"({errors} looks in a row): {exc}"),
                                        "dead_after": self.dead_after})
                    return
                event = None
            if event is not None:
                event["message"] = scrub(str(event.get("message") or ""))
                yield TriggerEvent(event)
                return
            self.log.info("generation %d of job %s runs", self.generation, self.job_name)
            await asyncio.sleep(self._interval(remaining))

    def user_stop_by(self) -> str:
        """The ``requested_by`` of the cancel `on_kill` writes (`detached_run.user_stop_by`:
        it names the task instance and the try, when known)."""
        if self.waiting_task is None:
            return USER_STOP
        return user_stop_by(self.waiting_task)

    def _stop(self, catalog: Catalog, why: str, by: str | None = None) -> list[str]:
        lines = stop_run(catalog, self.generation, self.driver(), wait_s=STOP_WAIT_S, exit_s=2.0,
                         requested_by=by or f"SparkpointRunTrigger ({why})")
        for line in lines:
            self.log.info("stopping job %s: %s", self.job_name, line)
        return lines

    async def on_kill(self) -> None:
        """A user acted on the task (Airflow 3.3+): stop the run, unless the task instance
        is still deferred (the trigger is only moving to another triggerer).

        The stop runs shielded (`run_shielded`), on its own reference to the store."""
        if not self.cancel_on_kill:
            return
        await run_shielded(self._stop_unless_deferred())

    async def _stop_unless_deferred(self) -> None:
        task = self.waiting_task
        what = (f"job {self.job_name} generation {self.generation} (stop it with `sparkpoint savepoint "
                "--stop` if it was meant to end)")
        if task is not None and await still_deferred(task, self.state_of, self.log, what):
            return
        key, catalog = await open_catalog(self.job_name, self.checkpoint_dir, self.sparkpoint_conn_id)
        try:
            await run_blocking(self._stop, catalog, "the task was stopped", self.user_stop_by())
        finally:
            await release_catalog(key)

    async def cleanup(self) -> None:
        """Release the shared store client. On Airflow before 3.3 (no `on_kill`), a trigger
        cancelled before it fired also does what `on_kill` does: stop the run unless the task
        instance is still deferred (this runs on triggerer restarts too, where it is)."""
        await super().cleanup()
