"""`SparkpointCheckpointTrigger`: the deferrable half of the checkpoint sensor and of the
savepoint operator, run by the triggerer.

Two modes:

``checkpoint``       wait until `conditions.evaluate` says done (a completed checkpoint /
                     savepoint / healthy progress) or failed
``control_result``   wait until a control request (savepoint, stop) of a running job
                     completes, fails, expires, or the job dies

The trigger carries only JSON-safe values and never credentials: it names the
connection (`sparkpoint_conn_id`) or storage root (`checkpoint_dir`) and reads the
connection inside the triggerer with Airflow's async API.

Load on the triggerer and the store (hundreds of sensors may wait at once):

* Storage calls block; they run on a few threads shared by every Sparkpoint trigger of
  the process (`triggers.shared`: `POOL_THREADS`), never on the event loop and never on its default
  executor, so a slow or hung store holds neither the loop nor other triggers' threads.
  Python-heavy S3 calls (signing, parsing) compete with the loop for the GIL: few
  threads and few calls keep the loop responsive.
* A waiting ``checkpoint`` trigger reads one small object per poll, the job's status
  record (plus the savepoint directory listing when it waits for a savepoint), and the
  full look only when it moved (`services.conditions.ConditionWatch`).
* Triggers waiting on one store share one storage client (one boto3 client, not one
  per sensor). Poll intervals are jittered (±`JITTER`, `triggers.shared.next_wait`) and
  the first poll comes at a random point of the first interval, so a triggerer restart
  does not make every sensor hit the store in the same second.

When the user acts on the deferred task (mark failed, clear),
`on_kill` withdraws a control request nobody took yet, so no later run serves it;
`cleanup` releases the storage client on every exit (a triggerer restart hands the
trigger over, it does not cancel the request). It yields exactly one event::

    {"status": "success", ...payload}
    {"status": "error", "message": "...", "reason": "failed" | "timeout"}
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError, StorageError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.services.conditions import (
    CheckpointCondition,
    ConditionWatch,
    Outcome,
    evaluate,
)
from airflow_sparkpoint.services.control import (
    REQUEST_ID_RE,
    RequestOutcome,
    look_at_request,
    settle_request,
    withdraw_request,
)
from airflow_sparkpoint.services.stores import Catalog, scrub

# the shared names stay importable from here too, where they were first defined
from airflow_sparkpoint.triggers.shared import (
    MAX_POLL_ERRORS,
    POOL_THREADS,
    SHARED_STORES,
    check_event,
    next_wait,
    open_catalog,
    release_catalog,
    run_blocking,
)

__all__ = ["CLASSPATH", "MAX_POLL_ERRORS", "MODES", "POOL_THREADS", "SHARED_STORES",
           "SparkpointCheckpointTrigger", "check_event", "open_catalog", "release_catalog", "run_blocking"]

CLASSPATH = "airflow_sparkpoint.triggers.checkpoint.SparkpointCheckpointTrigger"
MODES = ("checkpoint", "control_result")


class SparkpointCheckpointTrigger(BaseTrigger):
    """Poll a Sparkpoint job's catalog until a wait is over (see the module docstring).

    :param job_name: the pipeline.
    :param mode: ``checkpoint`` or ``control_result``.
    :param checkpoint_dir: storage root; or `sparkpoint_conn_id` (resolved in the triggerer).
    :param sparkpoint_conn_id: a ``sparkpoint`` connection (default ``sparkpoint_default``
        when no `checkpoint_dir` is given).
    :param request_id: the control request to wait for (``control_result``).
    :param generation: ``checkpoint``: see `CheckpointCondition`; ``control_result``: the
        generation the request went to, whose liveness is watched.
    :param poll_interval: time between polls (a duration: seconds, a timedelta or ``"5s"``).
    :param deadline: epoch seconds after which the wait fails with reason ``timeout``
        (a deadline, not a duration: a triggerer restart does not extend it).
    The other parameters are those of `CheckpointCondition` (``checkpoint`` mode).
    """

    def __init__(
        self,
        *,
        job_name: str,
        mode: str = "checkpoint",
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        request_id: str | None = None,
        after_checkpoint_id: int | None = None,
        after_time: float | None = None,
        generation: int | None = None,
        min_checkpoints: int = 1,
        savepoint: bool = False,
        progress_within: float | timedelta | str | None = None,
        max_heartbeat_age: float | timedelta | str = 60.0,
        poll_interval: float | timedelta | str = 5.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"trigger mode={mode!r} is invalid; expected one of {', '.join(MODES)}")
        # Validates job_name, the filters and max_heartbeat_age in one place.
        self.condition = CheckpointCondition(
            job_name=job_name,
            after_checkpoint_id=after_checkpoint_id,
            after_time=after_time,
            generation=generation,
            min_checkpoints=min_checkpoints,
            savepoint=savepoint,
            progress_within=durations.optional_seconds("progress_within", progress_within),
            max_heartbeat_age=durations.seconds("max_heartbeat_age", max_heartbeat_age),
        )
        if mode == "control_result":
            if not isinstance(request_id, str) or not REQUEST_ID_RE.match(request_id):
                raise ConfigError(
                    f"request_id={request_id!r} is invalid for mode 'control_result'; expected "
                    "'<13 digits>-<8 hex>' as returned by ControlChannel.submit"
                )
        elif request_id is not None:
            raise ConfigError(f"request_id={request_id!r} is only valid with mode 'control_result'")
        poll_interval = durations.seconds("poll_interval", poll_interval)
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float))
            or not math.isfinite(deadline)
        ):
            raise ConfigError(f"deadline={deadline!r} is invalid; expected epoch seconds or None")
        self.job_name = job_name
        self.mode = mode
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self.request_id = request_id
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)
        self._catalog_cache: Catalog | None = None
        self._store_key: str | None = None
        #: the condition's looks (``checkpoint`` mode), reusing the last full look while nothing moved
        self.watch = ConditionWatch(self.condition, self.poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        cond = self.condition
        return (
            CLASSPATH,
            {
                "job_name": self.job_name,
                "mode": self.mode,
                "checkpoint_dir": self.checkpoint_dir,
                "sparkpoint_conn_id": self.sparkpoint_conn_id,
                "request_id": self.request_id,
                "after_checkpoint_id": cond.after_checkpoint_id,
                "after_time": cond.after_time,
                "generation": cond.generation,
                "min_checkpoints": cond.min_checkpoints,
                "savepoint": cond.savepoint,
                "progress_within": cond.progress_within,
                "max_heartbeat_age": cond.max_heartbeat_age,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    # ------------------------------------------------------------------ running

    async def _acatalog(self) -> Catalog:
        """The job's catalog on the shared store; the connection is read with Airflow's
        async API."""
        if self._catalog_cache is None:
            self._store_key, self._catalog_cache = await open_catalog(
                self.job_name, self.checkpoint_dir, self.sparkpoint_conn_id)
        return self._catalog_cache

    def _sleep_s(self, remaining: float | None) -> float:
        """The next poll interval, jittered; never past the deadline."""
        return next_wait(self.poll_interval, remaining, upwards_only=False)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        errors = 0
        catalog: Catalog | None = None
        # The deferring task has just looked itself: the first poll comes within one
        # interval, at a random point, so triggers started together (a triggerer restart
        # takes over hundreds at once) do not make their first full looks in one burst.
        await asyncio.sleep(random.uniform(0, self.poll_interval))
        while True:
            try:
                if catalog is None:
                    catalog = await self._acatalog()
                event = await run_blocking(self.poll, catalog)
                errors = 0
            except StorageError as exc:
                errors += 1
                if errors >= MAX_POLL_ERRORS:
                    yield TriggerEvent(_error(f"storage of job {self.job_name!r} unreachable "
                                              f"({errors} polls in a row): {exc}"))
                    return
                self.log.warning("poll %d of job %s failed, retrying: %s", errors, self.job_name, exc)
                event = None
            except Exception as exc:  # noqa: BLE001 - reported as the one error event
                yield TriggerEvent(_error(f"waiting on job {self.job_name!r} failed: {exc}"))
                return
            if event is not None:
                yield TriggerEvent(event)
                return
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                try:
                    event = await run_blocking(self.give_up, catalog)
                except Exception as exc:  # noqa: BLE001 - reported as the one error event
                    event = _error(f"timed out waiting on job {self.job_name!r} ({exc})", reason="timeout")
                yield TriggerEvent(event)
                return
            await asyncio.sleep(self._sleep_s(remaining))

    async def on_kill(self) -> None:
        """The user acted on the deferred task (Airflow 3.3+): withdraw its control
        request if no run took it yet, so that no run serves it later."""
        if self.mode != "control_result" or self.request_id is None:
            return
        catalog = await self._acatalog()
        result = await run_blocking(withdraw_request, catalog, self.request_id,
                                    "the waiting task was stopped (marked failed or cleared)")
        self.log.info("control request %s of job %s is %s", self.request_id, self.job_name, result.state)

    async def cleanup(self) -> None:
        """Release the shared store (on every exit: an event, a timeout, a triggerer
        restart or a user action); the last trigger using it closes its client."""
        key, self._store_key, self._catalog_cache = self._store_key, None, None
        await release_catalog(key)

    def poll(self, catalog: Catalog) -> dict[str, Any] | None:
        """One look at the job (blocking): the event when the wait is over, else None."""
        if self.mode == "checkpoint":
            outcome = self.look(catalog)
            if outcome.done:
                return {"status": "success", **outcome.payload}
            if outcome.error is not None:
                return _error(outcome.error)
            self.log.info("waiting for %s", outcome.waiting_for)
            return None
        assert self.request_id is not None
        request, state = look_at_request(catalog, self.request_id, generation=self.condition.generation,
                                         max_heartbeat_age=self.condition.max_heartbeat_age,
                                         poll_s=self.poll_interval)
        if request.done:
            return self._control_event(request)
        self.log.info("control request %s of job %s is %s", self.request_id, self.job_name, state.state)
        return None

    def look(self, catalog: Catalog, *, now: float | None = None) -> Outcome:
        """`conditions.evaluate`, through the trigger's `ConditionWatch` (it reads the
        status record, and the full look only when that moved)."""
        return self.watch.look(catalog, now=now)

    def give_up(self, catalog: Catalog | None) -> dict[str, Any]:
        """The event at the deadline (blocking): withdraw a request nobody took."""
        if self.mode == "control_result" and catalog is not None:
            assert self.request_id is not None
            event = self._control_event(settle_request(catalog, self.request_id, poll_s=self.poll_interval,
                                                       is_alive=None))
            if event["status"] == "error":
                event["reason"] = "timeout"
            return event
        waiting = ""
        if catalog is not None:
            waiting = evaluate(catalog, self.condition).waiting_for
        return _error(f"timed out waiting for {waiting or self.condition.describe()}", reason="timeout")

    def _control_event(self, request: RequestOutcome) -> dict[str, Any]:
        if request.result is None:
            return _error(request.error or f"control request {self.request_id} of job "
                                           f"{self.job_name!r} failed")
        result = request.result
        return {
            "status": "success",
            "kind": "savepoint",
            "job": self.job_name,
            "request_id": result.request_id,
            "generation": result.generation,
            "batch_id": result.batch_id,
            "savepoint_uri": result.savepoint,
        }


def _error(message: str, *, reason: str = "failed") -> dict[str, Any]:
    """An error event; its message scrubbed (`services.stores.scrub`: the credentials the
    trigger's hook resolved are registered there)."""
    return {"status": "error", "message": scrub(message), "reason": reason}
