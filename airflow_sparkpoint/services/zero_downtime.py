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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import (
    CutoverPlan,
    CutoverState,
    CutoverStore,
    ProgressSighting,
    check_plan_bounds,
    new_cutover_id,
    sighting_of,
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
    from airflow_sparkpoint.checkpoints.control import ControlRequest

__all__ = ["PHASES", "CutoverDriver", "CutoverLook", "CutoverOutcome", "DrivePosition", "GreenStart",
           "check_plan_bounds", "drive_cutover", "look", "plan_cutover", "resume_position"]


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
    # the bounds first: a bad argument is named whatever state the job is in, before any read
    check_plan_bounds(mode=mode, lag_batches=lag_batches, reach_timeout_s=reach_timeout_s)
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


#: the phases of a driven cutover, in order: green's warm-up, blue's stop after N,
#: green's claim, green's first commit
PHASES = ("warmup", "stop", "claim", "commit")


@dataclass(frozen=True)
class DrivePosition:
    """Where a drive of a cutover stands, as its driver carries it between looks (and a
    deferred task between its worker and its trigger): the `phase`, its `deadline`
    (epoch seconds), N and blue's ``stop_after`` request once agreed, blue's final
    checkpoint and savepoint once it stopped, green's generation once it claimed, when
    the drive `started`, the steps announced so far, and green's progress record as the
    warm-up's looks last saw it (`progress_seen`: its age is measured on this clock)."""

    phase: str
    deadline: float
    started: float
    after_batch: int | None = None
    request_id: str | None = None
    checkpoint: str | None = None
    savepoint: str | None = None
    green_generation: int | None = None
    steps: tuple[str, ...] = ()
    progress_seen: ProgressSighting | None = None

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "deadline": self.deadline, "started": self.started,
                "after_batch": self.after_batch, "request_id": self.request_id, "checkpoint": self.checkpoint,
                "savepoint": self.savepoint, "green_generation": self.green_generation,
                "steps": list(self.steps),
                "progress_seen": None if self.progress_seen is None else self.progress_seen.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> DrivePosition:
        """:raises ConfigError: not a position (`to_json`'s shape)."""
        try:
            position = cls(str(data["phase"]), float(data["deadline"]), float(data["started"]),
                           None if data.get("after_batch") is None else int(data["after_batch"]),
                           _opt_str(data.get("request_id")), _opt_str(data.get("checkpoint")),
                           _opt_str(data.get("savepoint")),
                           None if data.get("green_generation") is None else int(data["green_generation"]),
                           tuple(str(s) for s in data.get("steps") or ()),
                           None if data.get("progress_seen") is None
                           else ProgressSighting.from_json(data["progress_seen"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"cutover drive position {data!r} is invalid ({exc}); expected "
                              "DrivePosition.to_json's fields") from None
        if position.phase not in PHASES or (position.phase != "warmup" and (
                position.after_batch is None or position.request_id is None)):
            raise ConfigError(f"cutover drive position {data!r} is invalid; expected a phase of {PHASES} "
                              "with N and blue's request once agreed")
        return position


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class CutoverLook:
    """What one read-only look at a cutover's records (`look`) says to do next:
    `action` ``wait`` (nothing yet; `line` says where it stands), ``agree`` (green is
    within the plan's lag; blue is at `batch`), ``stopped`` (blue stopped after N:
    `checkpoint`, `savepoint`, at `at`), ``claimed`` (green claimed as `generation` at
    `at`), ``committed`` (green's first commit: `line`), ``uncommitted`` (no commit
    within the bound; the job is green's) or ``call_off`` (a bound passed, blue is gone
    or the comparison gate refused, before green's claim: `line` says why, `blue_stopped`
    whether blue stopped after N). `progress_seen`: green's progress record as a look in
    the warm-up saw it (the next position carries it)."""

    action: str
    line: str = ""
    batch: int | None = None
    checkpoint: str | None = None
    savepoint: str | None = None
    generation: int | None = None
    at: float = 0.0
    blue_stopped: bool = False
    progress_seen: ProgressSighting | None = None


def _open_state(store: CutoverStore, cutover_id: str) -> CutoverState:
    """The cutover's records; :raises CutoverError: it ended other than committed."""
    state = store.read(cutover_id)
    done = state.ended
    if done is not None and done.outcome != "committed":
        raise CutoverError(f"cutover {cutover_id} of job {store.catalog.job!r} ended {done.outcome} at "
                           f"{done.step}: {done.reason or 'no reason'}")
    return state


def resume_position(catalog: Catalog, cutover_id: str, *, within_s: float, now: float) -> DrivePosition:
    """Where a drive of cutover `cutover_id` starts, from its records alone (a first
    start, or a task's resumption after its worker or triggerer restarted): not agreed:
    the warm-up, bounded by `within_s` from `now`; agreed: blue's stop after the agreed N,
    bounded by the plan's reach timeout from the agreement (the looks then move on
    through what blue and green recorded since).

    :raises CutoverError: not planned, or ended other than committed.
    """
    state = _open_state(CutoverStore(catalog), cutover_id)
    agreed = state.agreed
    if agreed is None:
        # An earlier drive that filed blue's request and ended before `agreed` (fault
        # point cutover_agreement): carried in the position, the first look calls the
        # cutover off (never a second request: blue may have taken the first).
        filed = _filed_stop_after(catalog, state)
        return DrivePosition("warmup", now + within_s, now, *((filed.after_batch, filed.id) if filed else ()))
    # a fresh bound on this orchestrator's clock (a resumed task may run on another host)
    return DrivePosition("stop", now + state.plan.reach_timeout_s, now, agreed.after_batch, agreed.request_id)


def _filed_stop_after(catalog: Catalog, state: CutoverState) -> ControlRequest | None:
    """The ``stop_after`` request of cutover `state` filed for blue, if any (read at a
    drive's start only: it reads every request of the job)."""
    channel = ControlChannel(catalog)
    for request_id in channel.request_ids():
        try:
            request = channel.read_request(request_id)
        except ControlError:
            continue  # gone (cleaned up) or unreadable: not this cutover's to act on
        if request.kind == "stop_after" and request.cutover == state.id:
            return request
    return None


def look(catalog: Catalog, cutover_id: str, position: DrivePosition, *, max_heartbeat_age: float,
         now: float) -> CutoverLook:
    """One look at cutover `cutover_id` in `position`'s phase: reads its records, blue's
    status and request, writes nothing (the triggerer runs it too). A bound is passed
    when `now` >= the position's deadline.

    :raises CutoverError: the cutover ended other than committed, or was agreed by
        another orchestrator while this one warmed up.
    """
    state = _open_state(CutoverStore(catalog), cutover_id)
    plan, phase = state.plan, position.phase
    passed = now >= position.deadline
    if phase == "warmup":
        if position.request_id is not None:
            return _look_filed(catalog, state, position.request_id, int(position.after_batch or 0))
        return _look_warmup(catalog, state, passed=passed, within_s=position.deadline - position.started,
                            now=now, max_heartbeat_age=max_heartbeat_age, seen=position.progress_seen)
    n = position.after_batch
    if phase == "stop":
        return _look_stop(catalog, plan, str(position.request_id), int(n or 0), passed=passed,
                          max_heartbeat_age=max_heartbeat_age)
    if phase == "claim":
        if state.taken is not None:  # decided: green's, even if it died before its claimed record
            return CutoverLook("claimed", generation=state.taken.generation, at=state.taken.at)
        if passed:
            return CutoverLook("call_off", f"green did not take the job over within "
                               f"{plan.reach_timeout_s:.0f} s after blue stopped", blue_stopped=True)
        return CutoverLook("wait", f"waiting for green to claim the job at batch {n}")
    if state.ended is not None:
        return CutoverLook("committed", state.ended.reason)
    if passed:
        return CutoverLook("uncommitted", f"green has not committed batch {int(n or 0) + 1} yet (no input "
                           "since?); the job is green's")
    return CutoverLook("wait", f"waiting for green's first commit (batch {int(n or 0) + 1})")


def _look_filed(catalog: Catalog, state: CutoverState, request_id: str, n: int) -> CutoverLook:
    result = ControlChannel(catalog).result(request_id)
    return CutoverLook("call_off", f"an earlier drive of the cutover filed blue's stop_after request "
                       f"{request_id} (after batch {n}) and ended before the agreement",
                       blue_stopped=result.state in ("acknowledged", "completed"))


def _look_warmup(catalog: Catalog, state: CutoverState, *, passed: bool, within_s: float, now: float,
                 max_heartbeat_age: float, seen: ProgressSighting | None) -> CutoverLook:
    plan = state.plan
    if state.agreed is not None:
        raise CutoverError(f"cutover {plan.id} is agreed already (batch {state.agreed.after_batch}); another "
                           "orchestrator drives it")
    status = read_job_status(catalog)
    if status is None or status.generation != plan.blue_generation or not status.is_alive(max_heartbeat_age):
        return CutoverLook("call_off", f"blue (generation {plan.blue_generation}) no longer runs",
                           blue_stopped=True)
    progress = state.progress
    if progress is not None and progress.difference:
        return CutoverLook("call_off", f"the comparison gate found a difference: {progress.difference}")
    seen = sighting_of(progress, seen, now)
    blue_last = -1 if status.last_batch is None else status.last_batch
    replayed = None if progress is None else progress.replayed_batch
    started = progress is not None and progress.seconds_per_batch is not None
    # its age on this orchestrator's clock: unchanged since this drive first saw it
    stale = "" if progress is None or seen is None or now - seen.since <= max_heartbeat_age else \
        f" (unchanged for {now - seen.since:.0f} s: is green gone?)"
    standing = (f"warm-up: green replayed through batch {replayed if replayed is not None else '-'}"
                f"{'' if started else ' (no replay yet: its first query start is ahead)'}{stale}, "
                f"blue at batch {blue_last} (lag bound {plan.lag_batches})")
    if progress is not None and progress.within(blue_last, plan.lag_batches, seen=seen, now=now,
                                                max_age=max_heartbeat_age):
        return CutoverLook("agree", standing, batch=blue_last, progress_seen=seen)
    if passed:
        idle = "" if started else " (it replayed none of blue's batches: no new input for blue?)"
        return CutoverLook("call_off", f"green did not come within {plan.lag_batches} batch(es) of blue in "
                           f"{within_s:.0f} s{idle}", progress_seen=seen)
    return CutoverLook("wait", standing, progress_seen=seen)


def _look_stop(catalog: Catalog, plan: CutoverPlan, request_id: str, n: int, *, passed: bool,
               max_heartbeat_age: float) -> CutoverLook:
    blue = plan.blue_generation
    alive = generation_alive(catalog, blue, max_heartbeat_age)  # before the result: a run that
    result = ControlChannel(catalog).result(request_id)         # completes, then exits, is seen completed
    stopped = not alive and catalog.current_generation() == blue
    if result.state == "completed":
        if result.batch_id != n or not result.checkpoint:
            return CutoverLook("call_off", f"blue stopped at batch {result.batch_id}, not after batch {n}",
                               blue_stopped=True)
        return CutoverLook("stopped", checkpoint=result.checkpoint, savepoint=result.savepoint,
                           at=result.updated_at)
    what = f"blue did not stop after batch {n}: stop_after request {request_id} of job {catalog.job!r}"
    if result.state in ("failed", "expired"):
        return CutoverLook("call_off", f"{what} {result.state}: {result.error or 'no reason given'}",
                           blue_stopped=stopped)
    if not alive:
        why = ("was acknowledged but the job stopped before finishing it" if result.state == "acknowledged"
               else "was not taken: the job is not running")
        return CutoverLook("call_off", f"{what} {why}", blue_stopped=stopped)
    if passed:
        return CutoverLook("call_off", f"{what} timed out after {plan.reach_timeout_s:g} s ({result.state})",
                           blue_stopped=stopped)
    return CutoverLook("wait", f"waiting for blue to stop after batch {n} (request {result.state})")


class CutoverDriver:
    """The orchestrator's writes of a driven cutover, in the worker only: `advance`
    takes a look's decision (the agreement with blue's ``stop_after`` request, the
    call-off, the next phase) and announces each step through `on_step`. `drive_cutover`
    and the deferrable `SparkpointCutoverOperator` both drive with it.

    :raises ConfigError: bad `within_s` or `margin`.
    """

    def __init__(self, catalog: Catalog, cutover_id: str, *, within_s: float, requested_by: str,
                 margin: int = 2, poll_s: float = 1.0, max_heartbeat_age: float = 60.0,
                 on_step: Callable[[str], None] = lambda _m: None) -> None:
        if not isinstance(margin, int) or isinstance(margin, bool) or margin < 1:
            raise ConfigError(f"cutover margin={margin!r} is invalid; expected an integer >= 1 (batches "
                              "ahead of blue)")
        if not isinstance(within_s, (int, float)) or isinstance(within_s, bool) or within_s <= 0:
            raise ConfigError(f"cutover_within={within_s!r} is invalid; expected a number of seconds > 0")
        self.catalog, self.cutover_id, self.store = catalog, cutover_id, CutoverStore(catalog)
        self.within_s, self.margin, self.poll_s = float(within_s), margin, poll_s
        self.max_heartbeat_age, self.requested_by, self._on_step = max_heartbeat_age, requested_by, on_step
        self.steps: list[str] = []
        self._shown = ""

    def note(self, position: DrivePosition, seen: CutoverLook) -> DrivePosition:
        """Carry what a look in the warm-up saw of green's progress record, and announce
        green's warm-up standing when it changed."""
        if position.phase != "warmup":
            return position
        if seen.progress_seen is not None:
            position = replace(position, progress_seen=seen.progress_seen)
        if seen.action in ("wait", "agree") and seen.line != self._shown:
            self._shown = seen.line
            self.steps[:] = [*position.steps, seen.line]
            self._on_step(f"cutover {self.cutover_id}: {seen.line}")
            return replace(position, steps=tuple(self.steps))
        return position

    def step(self, message: str) -> None:
        self.steps.append(message)
        self._on_step(f"cutover {self.cutover_id}: {message}")

    def begin(self, now: float) -> DrivePosition:
        """The position to drive from (`resume_position`), announced.

        :raises CutoverError: not planned, or ended other than committed."""
        position = resume_position(self.catalog, self.cutover_id, within_s=self.within_s, now=now)
        plan = self.store.read(self.cutover_id).plan
        if position.phase == "warmup":
            self.step(f"planned: blue generation {plan.blue_generation}, green {plan.green_job} warms up "
                      f"from batch {plan.warmup_batch} ({plan.mode})")
        else:
            self.step(f"resumed: agreed already, blue stops after batch {position.after_batch} (request "
                      f"{position.request_id})")
        return replace(position, steps=tuple(self.steps))

    def look(self, position: DrivePosition, now: float) -> CutoverLook:
        return look(self.catalog, self.cutover_id, position, max_heartbeat_age=self.max_heartbeat_age,
                    now=now)

    def advance(self, position: DrivePosition, seen: CutoverLook,
                now: float) -> DrivePosition | CutoverOutcome:
        """Act on look `seen` (not ``wait``): the next position, or the outcome once green
        committed (or the commit bound passed).

        :raises CutoverError: the cutover was called off (the message says whether blue
            runs on or has to be started again with ``restore=latest``).
        :raises CatalogError: blue no longer runs at the agreement.
        """
        self.steps[:] = list(position.steps)
        plan = self.store.read(self.cutover_id).plan
        action, n = seen.action, position.after_batch
        if action == "call_off":
            return self._call_off(position, seen, now)
        if action == "agree" and position.phase == "warmup":
            agreed_n = int(seen.batch if seen.batch is not None else -1) + self.margin
            request_id, at = self._agree(plan, agreed_n)
            return replace(position, phase="stop", deadline=at + plan.reach_timeout_s, after_batch=agreed_n,
                           request_id=request_id, steps=tuple(self.steps))
        if action == "stopped" and position.phase == "stop":
            self.step(f"blue (generation {plan.blue_generation}) committed through batch {n} and stopped; "
                      f"final checkpoint {seen.checkpoint}, final savepoint {seen.savepoint or '(none)'}")
            # bounds run on this orchestrator's clock from when it saw the step, never
            # from a time another host wrote (blue's, green's clock may be off)
            return replace(position, phase="claim", deadline=now + plan.reach_timeout_s,
                           checkpoint=seen.checkpoint, savepoint=seen.savepoint, steps=tuple(self.steps))
        if action == "claimed" and position.phase == "claim":
            self.step(f"green claimed the job as generation {seen.generation} at batch {n} (blue fenced)")
            return replace(position, phase="commit", deadline=now + plan.reach_timeout_s,
                           green_generation=seen.generation, steps=tuple(self.steps))
        if action in ("committed", "uncommitted") and position.phase == "commit":
            self.step(f"green committed its first batch into the job's sinks: {seen.line}"
                      if action == "committed" else seen.line)
            return CutoverOutcome(self.cutover_id, "committed" if action == "committed" else "claimed",
                                  int(n or 0), plan.blue_generation, position.green_generation,
                                  position.checkpoint, max(0.0, now - position.started), tuple(self.steps),
                                  position.savepoint)
        raise CutoverError(f"cutover {self.cutover_id}: a look said {action!r} in phase {position.phase!r}; "
                           f"expected one of that phase's outcomes")

    def _agree(self, plan: CutoverPlan, n: int) -> tuple[str, float]:
        stop = stop_after_batch(self.catalog, n, timeout_s=plan.reach_timeout_s, poll_s=self.poll_s,
                                max_heartbeat_age=self.max_heartbeat_age, requested_by=self.requested_by,
                                wait=False, generation=plan.blue_generation, cutover_id=self.cutover_id)
        try:
            agreement = self.store.agree(self.cutover_id, n, stop.request_id)
        except BaseException:
            ControlChannel(self.catalog).withdraw(stop.request_id, f"cutover {self.cutover_id}: not agreed")
            raise
        self.step(f"agreed: blue stops after batch {n} (request {stop.request_id}); green claims at "
                  f"batch {n + 1}")
        return stop.request_id, agreement.at

    def _call_off(self, position: DrivePosition, seen: CutoverLook, now: float) -> DrivePosition:
        """Call the cutover off; if green took it meanwhile (in any phase: a bound may pass
        as blue stops and green claims), it is green's: phase claim, whose next look sees
        the take-over and reports it.

        :raises CutoverError: called off (names what became of blue)."""
        try:
            end = call_off(self.catalog, self.cutover_id, reason=seen.line, by=self.requested_by)
        except CutoverError:
            state = self.store.read(self.cutover_id)
            taken, agreed = state.taken, state.agreed
            if taken is None or agreed is None:
                raise
            if position.phase == "claim":
                return position  # green claimed between the look and the call-off
            # green took the job while another step's bound passed: its claim names N and
            # blue's final checkpoint and savepoint, which that step's look did not see
            return replace(position, phase="claim", deadline=now + state.plan.reach_timeout_s,
                           after_batch=agreed.after_batch, request_id=agreed.request_id,
                           checkpoint=position.checkpoint or taken.checkpoint,
                           savepoint=position.savepoint or taken.savepoint)
        self.step(f"called off ({end.outcome} at {end.step}): {seen.line}")
        # Blue took the cutover's request if the call-off could not withdraw it: it stops
        # after that batch regardless (and a blue that is gone is gone).
        took = position.request_id is not None and ControlChannel(self.catalog).result(
            position.request_id).state in ("acknowledged", "completed")
        if seen.blue_stopped or took:
            after = (f"blue stopped (or stops) after batch {position.after_batch}, as asked"
                     if took else "blue no longer runs")
            after += (": start blue's code again with restore=latest (its own lineage: nothing is lost or "
                      "repeated)")
        else:
            after = "blue keeps running, untouched"
        raise CutoverError(f"cutover {self.cutover_id} of job {self.catalog.job!r} called off: {seen.line}; "
                           f"{after}")


def drive_cutover(catalog: Catalog, cutover_id: str, *, within_s: float, requested_by: str, margin: int = 2,
                  poll_s: float = 1.0, max_heartbeat_age: float = 60.0,
                  on_step: Callable[[str], None] = lambda _m: None,
                  clock: Callable[[], float] = time.time,
                  sleep: Callable[[float], None] = time.sleep) -> CutoverOutcome:
    """Drive planned cutover `cutover_id` of `catalog`'s job to green's first commit
    (module docstring), blocking: `look` every `poll_s` seconds, `CutoverDriver.advance`
    on every decision. It starts where the records stand (`resume_position`). `within_s`
    bounds the warm-up (green within the plan's lag); blue's stop, green's claim and
    green's first commit are each bounded by the plan's ``reach_timeout_s`` from the
    agreement, blue's recorded stop and green's recorded claim. `clock`: epoch seconds.

    :raises ConfigError: bad `within_s` or `margin`.
    :raises CutoverError: the cutover is not planned, was called off or ended; a bound
        passed before green's claim (the cutover is called off; the message says whether
        blue runs on or has to be started again with ``restore=latest``); the
        comparison gate found a difference (named).
    :raises CatalogError: blue no longer runs at the agreement.
    """
    driver = CutoverDriver(catalog, cutover_id, within_s=within_s, requested_by=requested_by, margin=margin,
                           poll_s=poll_s, max_heartbeat_age=max_heartbeat_age, on_step=on_step)
    position = driver.begin(clock())
    while True:
        seen = driver.look(position, clock())
        position = driver.note(position, seen)
        if seen.action == "wait":
            sleep(poll_s)
            continue
        moved = driver.advance(position, seen, clock())
        if isinstance(moved, CutoverOutcome):
            return moved
        position = moved
