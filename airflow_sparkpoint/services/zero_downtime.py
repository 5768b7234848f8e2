"""The orchestrator's side of a zero-downtime cutover (issue 49), one use case per call
the front ends make (`SparkpointPreflightOperator(zero_downtime=True)`,
`SparkpointCutoverOperator`):

* `plan_cutover`: blue (the job's live generation) hands over to a green that warms up
  from blue's newest completed checkpoint K: write the plan and return the
  ``spark.sparkpoint.*`` settings green's submit adds (shadow of the job, scratch root,
  K, the cutover's id). Green is then started with blue's production arguments and
  these settings (its own task: it runs on as the job after the takeover).
* `drive_cutover`: wait until green's warm-up is within the plan's lag of blue (the
  comparison gate, ``mode="compare"``, refuses on green's first difference); agree N =
  blue's newest batch + `margin` and ask blue to stop after N (`stop_after_batch`); wait
  for blue's stop at N, green's claim of the job (generation blue + 1) and green's first
  commit (``done: committed``, written by green's run). If a bound passes before green's
  claim, the cutover is called off (`call_off`): before the agreement blue runs on
  untouched; after blue stopped at N, blue is restarted with ``restore=latest`` (its
  own lineage at N: nothing lost or repeated).

Each step is announced through `on_step` (the task log). Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import (
    MODES,
    CutoverPlan,
    CutoverState,
    CutoverStore,
    new_cutover_id,
)
from airflow_sparkpoint.checkpoints.history import generation_alive
from airflow_sparkpoint.checkpoints.history_records import read_generation
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.exceptions import CatalogError, ConfigError, ControlError, CutoverError
from airflow_sparkpoint.runtime.config import PREFIX
from airflow_sparkpoint.services.cutover import call_off, stop_after_batch
from airflow_sparkpoint.services.savepoint import savepoint_source

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["CutoverOutcome", "GreenStart", "drive_cutover", "plan_cutover"]


@dataclass(frozen=True)
class GreenStart:
    """A planned cutover: its `plan`, and the ``spark.sparkpoint.*`` `settings` green's
    submit adds to blue's production arguments."""

    plan: CutoverPlan
    settings: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"cutover_id": self.plan.id, "blue_generation": self.plan.blue_generation,
                "warmup_uri": self.plan.warmup_uri, "warmup_batch": self.plan.warmup_batch,
                "green_job": self.plan.green_job, "green_root": self.plan.green_root, "mode": self.plan.mode,
                "green_conf": dict(self.settings)}


def plan_cutover(catalog: Catalog, *, green_root: str, requested_by: str, mode: str = "discard",
                 lag_batches: int = 2, reach_timeout_s: float = 600.0, max_heartbeat_age: float = 60.0,
                 warmup_uri: str | None = None) -> GreenStart:
    """Plan a cutover of `catalog`'s live job to a green warming up from `warmup_uri` (a
    completed checkpoint of blue's, e.g. the one the pre-flight restored; default blue's
    newest) in a scratch root of its own under `green_root`.

    :raises CatalogError: no live run (a stopped job needs no zero-downtime handover:
        start green from its newest checkpoint), or no such checkpoint.
    :raises ConfigError: bad bounds or mode, or blue runs with a trigger that ends by
        itself or with ``commit.mode=external`` (blue cannot stop after a chosen batch then).
    :raises CutoverError: another cutover of the job is open.
    """
    if mode not in MODES:
        raise ConfigError(f"cutover mode={mode!r} is invalid; expected one of {', '.join(MODES)}")
    source = savepoint_source(catalog, max_heartbeat_age)
    if source.run is None:
        raise CatalogError(f"job {catalog.job!r} {source.why_not_running()}; a zero-downtime cutover hands "
                           "a running blue over (for a stopped job, start green from its newest checkpoint)")
    blue = source.run.generation
    _check_blue(catalog, blue)
    if warmup_uri is None:
        latest = catalog.latest()
        if latest is None:
            raise CatalogError(f"job {catalog.job!r} has no completed checkpoint under {catalog.uri} to warm "
                               "green up from")
        warmup_uri, warmup_batch = catalog.checkpoint_uri(latest.id), latest.batch_id
    else:
        handle = catalog.own_snapshot(warmup_uri)
        if handle is None:
            raise CatalogError(f"{warmup_uri} is not a completed checkpoint of job {catalog.job!r}; expected "
                               "one of blue's (see `sparkpoint list`)")
        warmup_batch = handle.metadata.batch_id
    cutover_id = new_cutover_id()
    root = f"{green_root.rstrip('/')}/{cutover_id}"
    plan = CutoverStore(catalog).plan(CutoverPlan(
        cutover_id, catalog.job, blue, warmup_uri, warmup_batch, f"{catalog.job}-shadow", root, mode=mode,
        lag_batches=lag_batches, reach_timeout_s=reach_timeout_s, requested_by=requested_by,
        created_at=time.time()))
    settings = {f"{PREFIX}shadow.mode": mode, f"{PREFIX}shadow.dir": root,
                f"{PREFIX}shadow.job": plan.green_job, f"{PREFIX}shadow.from": warmup_uri,
                f"{PREFIX}cutover": cutover_id}
    return GreenStart(plan, settings)


def _check_blue(catalog: Catalog, generation: int) -> None:
    """Refuse a blue that cannot stop after a chosen batch (its recorded config).

    :raises ConfigError: naming the setting."""
    config = read_generation(catalog, generation, current=generation).config or {}
    trigger = str(config.get("trigger") or "")
    if trigger and not trigger.startswith("processingTime"):
        raise ConfigError(f"job {catalog.job!r} generation {generation} runs with trigger={trigger!r}; a "
                          "zero-downtime cutover needs a blue that keeps running (processingTime:<interval>)")
    if str(config.get("commit.mode") or "checkpoint") != "checkpoint":
        raise ConfigError(f"job {catalog.job!r} generation {generation} runs with "
                          f"commit.mode={config.get('commit.mode')!r}; blue stops after a chosen batch only "
                          "with commit.mode=checkpoint")


@dataclass(frozen=True)
class CutoverOutcome:
    """How `drive_cutover` left the cutover: `step` ``committed`` (green's first commit
    landed) or ``claimed`` (green took the job over; no input since N yet), N, the
    generations, blue's final checkpoint, the steps announced, and blue's final savepoint
    of N (what a rollback after the cutover restores)."""

    cutover_id: str
    step: str
    after_batch: int
    blue_generation: int
    green_generation: int | None
    blue_checkpoint: str | None
    seconds: float
    steps: tuple[str, ...] = field(default=())
    blue_savepoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"cutover_id": self.cutover_id, "step": self.step, "after_batch": self.after_batch,
                "blue_generation": self.blue_generation, "green_generation": self.green_generation,
                "blue_checkpoint": self.blue_checkpoint, "seconds": round(self.seconds, 3),
                "steps": list(self.steps), "blue_savepoint": self.blue_savepoint}


class _Driver:
    def __init__(self, catalog: Catalog, cutover_id: str, *, within_s: float, poll_s: float,
                 max_heartbeat_age: float, requested_by: str, on_step: Callable[[str], None],
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self.catalog, self.cutover_id = catalog, cutover_id
        self.store = CutoverStore(catalog)
        self.within_s, self.poll_s, self.max_heartbeat_age = within_s, poll_s, max_heartbeat_age
        self.requested_by, self.clock, self.sleep = requested_by, clock, sleep
        self._on_step = on_step
        self.steps: list[str] = []
        self.started = clock()

    def step(self, message: str) -> None:
        self.steps.append(message)
        self._on_step(f"cutover {self.cutover_id}: {message}")

    def read(self) -> CutoverState:
        state = self.store.read(self.cutover_id)
        if state.done is not None and state.done.outcome != "committed":
            raise CutoverError(f"cutover {self.cutover_id} of job {self.catalog.job!r} ended "
                               f"{state.done.outcome} at {state.done.step}: "
                               f"{state.done.reason or 'no reason'}")
        return state

    def call_off(self, why: str, *, blue_stopped: bool) -> CutoverError:
        end = call_off(self.catalog, self.cutover_id, reason=why, by=self.requested_by)
        self.step(f"called off ({end.outcome} at {end.step}): {why}")
        after = ("blue stopped after the agreed batch: start blue's code again with restore=latest (its own "
                 "lineage: nothing is lost or repeated)" if blue_stopped else "blue keeps running, untouched")
        return CutoverError(f"cutover {self.cutover_id} of job {self.catalog.job!r} called off: {why}; "
                            f"{after}")

    def warm_up(self, plan: CutoverPlan) -> int:
        """Wait until green is within the plan's lag of blue; blue's newest batch then."""
        deadline = self.started + self.within_s
        shown: tuple[Any, ...] | None = None
        while True:
            state = self.read()
            if state.agreed is not None:
                raise CutoverError(f"cutover {self.cutover_id} is agreed already (batch "
                                   f"{state.agreed.after_batch}); another orchestrator drives it")
            status = read_job_status(self.catalog)
            if status is None or status.generation != plan.blue_generation or \
                    not status.is_alive(self.max_heartbeat_age):
                raise self.call_off(f"blue (generation {plan.blue_generation}) no longer runs",
                                    blue_stopped=False)
            progress = state.progress
            if progress is not None and progress.difference:
                raise self.call_off(f"the comparison gate found a difference: {progress.difference}",
                                    blue_stopped=False)
            blue_last = -1 if status.last_batch is None else status.last_batch
            replayed = None if progress is None else progress.replayed_batch
            started = progress is not None and progress.seconds_per_batch is not None
            if (replayed, started, blue_last) != shown:
                shown = (replayed, started, blue_last)
                self.step(f"warm-up: green replayed through batch "
                          f"{replayed if replayed is not None else '-'}"
                          f"{'' if started else ' (no replay yet: its first query start is ahead)'}, "
                          f"blue at batch {blue_last} (lag bound {plan.lag_batches})")
            if progress is not None and progress.within(blue_last, plan.lag_batches):
                return blue_last
            if self.clock() >= deadline:
                idle = "" if started else " (it replayed none of blue's batches: no new input for blue?)"
                raise self.call_off(f"green did not come within {plan.lag_batches} batch(es) of blue in "
                                    f"{self.within_s:.0f} s{idle}", blue_stopped=False)
            self.sleep(self.poll_s)

    def agree(self, plan: CutoverPlan, n: int) -> str:
        stop = stop_after_batch(self.catalog, n, timeout_s=plan.reach_timeout_s, poll_s=self.poll_s,
                                max_heartbeat_age=self.max_heartbeat_age, requested_by=self.requested_by,
                                wait=False, generation=plan.blue_generation, cutover_id=self.cutover_id)
        try:
            self.store.agree(self.cutover_id, n, stop.request_id)
        except BaseException:
            ControlChannel(self.catalog).withdraw(stop.request_id, f"cutover {self.cutover_id}: not agreed")
            raise
        self.step(f"agreed: blue stops after batch {n} (request {stop.request_id}); green claims at "
                  f"batch {n + 1}")
        return stop.request_id

    def blue_stop(self, plan: CutoverPlan, request_id: str, n: int) -> tuple[str, str | None]:
        """Wait for blue's stop after N: ``(its final checkpoint, its final savepoint)``."""
        channel = ControlChannel(self.catalog)
        blue = plan.blue_generation
        try:
            result = channel.wait(
                request_id, timeout_s=plan.reach_timeout_s, poll_s=self.poll_s,
                is_alive=lambda: generation_alive(self.catalog, blue, self.max_heartbeat_age))
        except ControlError as exc:
            stopped = self.catalog.current_generation() == blue and not generation_alive(
                self.catalog, blue, self.max_heartbeat_age)
            raise self.call_off(f"blue did not stop after batch {n}: {exc}", blue_stopped=stopped) from None
        if result.batch_id != n or not result.checkpoint:
            raise self.call_off(f"blue stopped at batch {result.batch_id}, not after batch {n}",
                                blue_stopped=True)
        self.step(f"blue (generation {blue}) committed through batch {n} and stopped; final checkpoint "
                  f"{result.checkpoint}, final savepoint {result.savepoint or '(none)'}")
        return result.checkpoint, result.savepoint

    def until(self, done: Callable[[CutoverState], bool], timeout_s: float) -> CutoverState | None:
        deadline = self.clock() + timeout_s
        while True:
            state = self.read()
            if done(state):
                return state
            if self.clock() >= deadline:
                return None
            self.sleep(self.poll_s)


def drive_cutover(catalog: Catalog, cutover_id: str, *, within_s: float, requested_by: str, margin: int = 2,
                  poll_s: float = 1.0, max_heartbeat_age: float = 60.0,
                  on_step: Callable[[str], None] = lambda _m: None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> CutoverOutcome:
    """Drive planned cutover `cutover_id` of `catalog`'s job to green's first commit
    (module docstring). `within_s` bounds the warm-up (green within the plan's lag);
    blue's stop, green's claim and green's first commit are each bounded by the plan's
    ``reach_timeout_s``.

    :raises ConfigError: bad `within_s` or `margin`.
    :raises CutoverError: the cutover is not planned, was called off or ended; a bound
        passed before green's claim (the cutover is called off; the message says whether
        blue runs on or has to be started again with ``restore=latest``); the
        comparison gate found a difference (named).
    :raises CatalogError: blue no longer runs at the agreement.
    """
    if not isinstance(margin, int) or isinstance(margin, bool) or margin < 1:
        raise ConfigError(f"cutover margin={margin!r} is invalid; expected an integer >= 1 (batches ahead "
                          "of blue)")
    if not isinstance(within_s, (int, float)) or isinstance(within_s, bool) or within_s <= 0:
        raise ConfigError(f"cutover_within={within_s!r} is invalid; expected a number of seconds > 0")
    driver = _Driver(catalog, cutover_id, within_s=within_s, poll_s=poll_s,
                     max_heartbeat_age=max_heartbeat_age, requested_by=requested_by, on_step=on_step,
                     clock=clock, sleep=sleep)
    plan = driver.read().plan
    driver.step(f"planned: blue generation {plan.blue_generation}, green {plan.green_job} warms up "
                f"from batch {plan.warmup_batch} ({plan.mode})")
    n = driver.warm_up(plan) + margin
    request_id = driver.agree(plan, n)
    checkpoint, savepoint = driver.blue_stop(plan, request_id, n)
    claimed = driver.until(lambda s: s.claimed is not None, plan.reach_timeout_s)
    if claimed is None:
        why = f"green did not take the job over within {plan.reach_timeout_s:.0f} s after blue stopped"
        try:
            error = driver.call_off(why, blue_stopped=True)
        except CutoverError:  # green claimed it between the last look and the call-off: it is green's
            claimed = driver.read()
            if claimed.claimed is None:
                raise
        else:
            raise error
    assert claimed.claimed is not None
    green = claimed.claimed.generation
    driver.step(f"green claimed the job as generation {green} at batch {n} (blue fenced)")
    committed = driver.until(lambda s: s.done is not None, plan.reach_timeout_s)
    if committed is not None and committed.done is not None:
        driver.step(f"green committed its first batch into the job's sinks: {committed.done.reason}")
    else:
        driver.step(f"green has not committed batch {n + 1} yet (no input since?); the job is green's")
    return CutoverOutcome(cutover_id, "committed" if committed is not None else "claimed", n,
                          plan.blue_generation, green, checkpoint, clock() - driver.started,
                          tuple(driver.steps), savepoint)
