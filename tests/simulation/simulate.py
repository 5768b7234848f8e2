"""Run one schedule and check the invariants (docs/PROTOCOL.md), after every step and at
the end.

A *schedule* is the actors that start together (drivers with their restore settings,
the commit step, savepoints, savepoint retention, rollbacks), the sink, the input, and
the scheduler's choices. At the end a clean driver resumes the job (``restore=latest``,
as a retry would) until the input is drained, and the commit step runs once more; then

* every input batch is visible exactly once, all of a batch from one generation, and the
  rows equal the oracle computed from the input files for that chain of batches (each
  batch's running sum continues the batches before it: nothing of an abandoned lineage
  is mixed in, nothing is lost or repeated);
* no transaction record and no staged data is left;
* nothing outside the roots changed;
* a start that was refused changed nothing but its own generation claim and status.

After every step: no batch is visible from two generations and no row twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.exceptions import (
    ConfigError,
    JobAlreadyRunning,
    RestoreError,
    SinkAheadError,
    SinkLineageError,
)
from tests.simulation import actors
from tests.simulation.actors import CutoverSpec, DriverSpec
from tests.simulation.model import DELTA_KINDS, expected_rows, visible_rows, visible_signature
from tests.simulation.scheduler import Chooser, Scheduler
from tests.simulation.world import JOB, World

#: errors with which a start is refused (bad input, a sink it must not touch)
REFUSALS = (RestoreError, SinkAheadError, ConfigError, JobAlreadyRunning)
#: what a refused start may have written: its own claim and status
REFUSED_MAY_WRITE = (f"store:put_if_absent {JOB}/generations/", f"store:put {JOB}/status")


class Violation(AssertionError):
    """An invariant failed; the message has the schedule and its trace."""


@dataclass(frozen=True)
class ActorSpec:
    kind: str  # driver | commit | savepoint | stop | retention | rollback | cutover | calloff
    driver: DriverSpec | None = None
    keep: int = 1
    cutover: CutoverSpec | None = None

    def describe(self) -> str:
        if self.kind == "cutover":
            assert self.cutover is not None
            return self.cutover.describe()
        if self.kind == "driver":
            assert self.driver is not None
            return f"driver({self.driver.describe()})"
        if self.kind == "retention":
            return f"savepoint-retention(keep={self.keep})"
        if self.kind == "calloff":
            return "call-off"
        return self.kind


@dataclass(frozen=True)
class Schedule:
    sink: str  # directory | delta
    inputs: int
    actors: tuple[ActorSpec, ...]
    #: what a `DirectedChooser` races on: kinds of records (`scheduler.ACCESSES`) and actors
    races: tuple[str, ...] = ()
    directed: tuple[int, ...] | None = None

    def describe(self) -> str:
        return f"{self.sink} sink, {self.inputs} input files; " + "; ".join(
            f"a{i} {a.describe()}" for i, a in enumerate(self.actors))


@dataclass
class Outcome:
    steps: int
    trace: list[str] = field(default_factory=list)


class CalmChooser(Chooser):
    """The end of a schedule: one actor at a time, nothing dies."""

    def pick(self, ready: list[Any]) -> int:
        return 0

    def event(self, actor: Any) -> int:
        return 0

    def option(self, count: int) -> int:
        return 0


def run_schedule(schedule: Schedule, chooser: Chooser, *, max_steps: int = 1500,
                 step_checks: bool = True) -> Outcome:
    """Run `schedule` with `chooser`'s choices and check it.

    :raises Violation: an invariant failed (the message holds the trace).
    """
    scheduler = Scheduler(chooser, max_steps=max_steps)
    world = World(scheduler, sink_kind=schedule.sink, inputs=schedule.inputs)
    try:
        with world.patched():
            before = world.outside_digest()
            if step_checks:
                scheduler.check = lambda: _check_step(world, scheduler, schedule)
            spawned = []
            for index, spec in enumerate(schedule.actors):
                name = f"a{index}-{spec.kind}"
                spawned.append((spec, scheduler.spawn(name, _body(world, spec, name))))
            scheduler.run()
            for spec, actor in spawned:
                if spec.kind == "driver" and isinstance(actor.error, REFUSALS):
                    _check_refused(world, scheduler, schedule, actor.name, actor.error)
                elif actor.error is not None and _aborted_by_a_fenced_run(world, actor.error):
                    world.repair_allowed = True  # the lineage waits until a person restores another point
                elif actor.error is not None and not _acceptable(spec, actor.error):
                    _fail(schedule, scheduler, f"{actor.name} failed unexpectedly: "
                                               f"{type(actor.error).__name__}: {actor.error}")
            _check_checkpoints(world, scheduler, schedule)
            _check_cutovers(world, scheduler, schedule)
            # The end: a retry resumes the job and drains the input; the commit step runs.
            scheduler.explored = scheduler.chooser
            scheduler.chooser = CalmChooser()
            scheduler.check = None
            scheduler.clock.advance(300.0)  # every dead run's heartbeat is old now
            # The end gets a step budget of its own: the explored part may have used most of
            # `max_steps`, and a calm retry draining every input must not be cut off by it.
            scheduler.max_steps = scheduler.steps + max_steps
            final_spec = _after_cutover(world, schedule, DriverSpec(budget=schedule.inputs + 1))
            final = scheduler.spawn("final-driver", lambda: actors.driver(world, final_spec, "final-driver"))
            scheduler.run()
            if isinstance(final.error, SinkLineageError) and (world.repair_allowed or _newest_lineage_revived(
                    world, final.error)):
                final = _repair(world, scheduler, schedule)
            elif isinstance(final.error, SinkAheadError) and "job code version" in str(final.error):
                final = _catch_up(world, scheduler, schedule)
            if final.error is not None or final.crashed:
                _fail(schedule, scheduler,
                      "a retry with restore=latest after this schedule did not resume the job: "
                      f"{type(final.error).__name__}: {final.error}")
            step = scheduler.spawn("final-commit", lambda: actors.commit_step(world))
            scheduler.run()
            if step.error is not None:
                _fail(schedule, scheduler,
                      f"the final commit step failed: {type(step.error).__name__}: {step.error}")
            if step.result.get("pending") or step.result.get("aborted"):
                _fail(schedule, scheduler, f"the final commit step found work left: {step.result}")
            _check_end(world, scheduler, schedule)
            _check_cutovers(world, scheduler, schedule)
            if world.outside_digest() != before:
                _fail(schedule, scheduler, "a file outside every root changed")
        return Outcome(scheduler.steps, scheduler.trace)
    finally:
        world.close()


def _after_cutover(world: World, schedule: Schedule, retry: DriverSpec) -> DriverSpec:
    """What the orchestrator does with the cutovers left open at the end: one green claimed
    is green's job (its task's retry names the cutover and runs green's code); every one
    not claimed is called off (blue's retry resumes its own lineage). Two can be open: a
    planner that found another open plan died before it ended its own."""
    from dataclasses import replace

    from airflow_sparkpoint.checkpoints.cutover import CutoverStore

    store = CutoverStore(world.raw_catalog())
    left = [state for state in (store.read(cid) for cid in store.ids()) if state.open]
    # not decided for green (decided for green: its own, even if it died before `claimed`)
    for state in left:
        if state.taken is None:
            actors.call_off_checked(world, world.raw_catalog(), state.id, reason="the schedule ended",
                                    by="harness")
    state = next((state for state in left if state.taken is not None), None)
    if state is None:
        return retry
    green = next((a.cutover for a in schedule.actors if a.kind == "cutover" and a.cutover is not None),
                 CutoverSpec())
    return replace(retry, version=green.version, cutover=state.id)


def _body(world: World, spec: ActorSpec, name: str) -> Callable[[], Any]:
    if spec.kind == "cutover":
        assert spec.cutover is not None
        cutover_spec = spec.cutover
        return lambda: actors.cutover(world, cutover_spec, name)
    if spec.kind == "driver":
        assert spec.driver is not None
        driver_spec = spec.driver
        return lambda: actors.driver(world, driver_spec, name)
    if spec.kind == "commit":
        return lambda: actors.commit_step(world)
    if spec.kind in ("savepoint", "stop"):
        return lambda: actors.savepoint(world, stop=spec.kind == "stop")
    if spec.kind == "retention":
        return lambda: actors.savepoint_retention(world, spec.keep)
    if spec.kind == "rollback":
        return lambda: actors.rollback(world)
    if spec.kind == "calloff":
        return lambda: actors.call_off_actor(world, name)
    raise ValueError(spec.kind)


def _acceptable(spec: ActorSpec, error: BaseException) -> bool:
    """Errors an actor may end with in a healthy system: a driver superseded or refused,
    a savepoint with nothing to copy or whose run went away, a commit step or rollback
    that met a newer generation or a live run."""
    from airflow_sparkpoint.exceptions import (
        CatalogError,
        ControlError,
        CutoverError,
        GenerationRunning,
        SparkpointError,
        StaleGeneration,
    )

    if spec.kind == "driver":
        # A superseded run fails at its next act, however it meets the newer one; the
        # current generation fails only for reasons that lose nothing.
        if isinstance(error, StaleGeneration) or getattr(error, "superseded", False):
            return True
        return isinstance(error, SparkpointError) and not _is_loss(error)
    if spec.kind in ("savepoint", "stop"):
        return isinstance(error, (CatalogError, ControlError, StaleGeneration))
    if spec.kind == "commit":
        return isinstance(error, StaleGeneration)
    if spec.kind == "rollback":  # refused while the generation runs or a newer one continues it
        return isinstance(error, (GenerationRunning, StaleGeneration, RestoreError))
    if spec.kind == "cutover":  # green fenced or refused, blue gone: the cutover stays open or ends
        if (isinstance(error, (StaleGeneration, CatalogError, ControlError))
            or getattr(error, "superseded", False)):
            return True
        return isinstance(error, SparkpointError) and not _is_loss(error)
    if spec.kind == "calloff":  # green's claim was decided first: it stands
        return isinstance(error, CutoverError) and "green's claim stands" in str(error)
    return False


def _is_loss(error: BaseException) -> bool:
    """A failure that says output was lost or could not be committed (never healthy)."""
    from airflow_sparkpoint.exceptions import TransactionConflict

    text = str(error)
    return isinstance(error, TransactionConflict) or "output is lost" in text or "was aborted" in text


# ---------------------------------------------------------------------------- checks


def _rows_by_batch(world: World, sink: Any) -> dict[int, list[dict[str, Any]]]:
    by_batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in visible_rows(sink):
        by_batch[int(row["batch"])].append(row)
    return by_batch


def _check_step(world: World, scheduler: Scheduler, schedule: Schedule) -> None:
    """After every step: no batch from two generations, no row twice."""
    if schedule.sink != "directory":
        return  # reading a Delta table at every step costs more than a schedule; checked at the end
    sink = world.reader_sink()
    signature = visible_signature(sink)
    if signature == world.checked_rows:
        return  # the very files this check passed on after an earlier step
    for batch, rows in _rows_by_batch(world, sink).items():
        generations = {row["generation"] for row in rows}
        if len(generations) > 1:
            _fail(schedule, scheduler, f"batch {batch} is visible from generations {sorted(generations)}")
        dupes = [line for line, n in Counter(row["line"] for row in rows).items() if n > 1]
        if dupes:
            _fail(schedule, scheduler, f"batch {batch} shows line(s) {dupes} more than once")
    world.checked_rows = signature


def _check_refused(world: World, scheduler: Scheduler, schedule: Schedule, name: str,
                   error: BaseException) -> None:
    """A refused start changed nothing but its claim and status. Past its origin, one
    refusal remains possible (docs/PROTOCOL.md, "A start refused after its origin"): a
    superseded run's commit in flight landed past the restart point after the start's
    checks (`SinkAheadError`, never a lineage mismatch). Its lineage is the job's from its
    origin on, and what its recovery did before the refusal is that lineage's; the end
    of the schedule checks that the job resumes exactly."""
    writes = world.writes.by_actor.get(name, [])
    past_origin = any(w.startswith(f"store:put_if_absent {JOB}/lineage/") for w in writes)
    if past_origin and type(error) is SinkAheadError:
        return
    if past_origin and _aborted_after_claim(world, name, error):
        world.repair_allowed = True  # the lineage it started is refused until a person restores another point
        return
    wrote = [w for w in writes if not w.startswith(REFUSED_MAY_WRITE)]
    if wrote:
        _fail(schedule, scheduler, f"{name} was refused but changed {wrote[:8]}")


def _check_checkpoints(world: World, scheduler: Scheduler, schedule: Schedule) -> None:
    """Every completed checkpoint still has its files (a deletion never breaks one: the
    journal, the grace period and the fence of retention, invariant 1)."""
    catalog = world.raw_catalog()
    for entry in catalog.list_checkpoints():
        if entry.metadata is None and entry.error and "referenced file" in entry.error:
            if _zombie_completion(world, catalog, entry.id):
                continue
            _fail(schedule, scheduler, f"completed checkpoint {entry.uri} lost a file: {entry.error}")


def _zombie_completion(world: World, catalog: Any, checkpoint_id: int) -> bool:
    """Whether checkpoint `checkpoint_id` was completed by a zombie: its ``_metadata`` was
    written after its generation g was fenced (``generations/<g+1>`` claimed before), the
    one act a fence check cannot prevent (PROTOCOL.md, "A zombie's checkpoint completed
    after the claim that fenced it"). Retention of the newer generation may have removed
    its files meanwhile: it is incomplete (invariant 1), so no restore uses it, and the
    end of the schedule checks that the job still resumes exactly."""
    from airflow_sparkpoint.checkpoints import layout

    key = f"{layout.checkpoint_dir(checkpoint_id)}/{layout.METADATA}"
    try:
        generation = int(json.loads(catalog.store.get(key))["generation"])
    except (KeyError, TypeError, ValueError, OSError):
        return False
    written = [i for i, (_a, w) in enumerate(world.writes.ordered) if w == f"store:put_if_absent {JOB}/{key}"]
    claim = f"store:put_if_absent {JOB}/generations/{generation + 1:012d}"
    fenced = next((i for i, (_a, w) in enumerate(world.writes.ordered) if w == claim), None)
    return bool(written) and fenced is not None and fenced < written[-1]


def _repair(world: World, scheduler: Scheduler, schedule: Schedule) -> Any:
    """What the refusal tells a person to do: restore a snapshot of the lineage the sink
    holds, by path; the snapshots are tried newest first, then empty state (restore=none,
    refused while the sink holds output of the job), until one starts, and then the job is
    resumed as a retry would. Returns the last driver's actor."""
    candidates = [*reversed(actors._snapshots(world)), "none"]  # last: empty state, when the sink allows it
    actor = None
    for index, uri in enumerate(candidates):
        name = f"repair-{index}"
        spec = DriverSpec(restore=uri, budget=schedule.inputs + 1)
        actor = scheduler.spawn(name, lambda spec=spec, name=name: actors.driver(world, spec, name))
        scheduler.run()
        if actor.error is None and not actor.crashed:
            break
    if actor is None or actor.error is not None:
        return actor
    resumed = scheduler.spawn("repaired-driver", lambda: actors.driver(
        world, DriverSpec(budget=schedule.inputs + 1), "repaired-driver"))
    scheduler.run()
    return resumed


def _catch_up(world: World, scheduler: Scheduler, schedule: Schedule) -> Any:
    """What the refusal of a replay by other code tells a person to do: run the version
    of the code that committed the sink's newest batch (it replays them exactly and goes
    on). Returns that driver's actor."""
    rows = visible_rows(world.sink())
    newest = max(rows, key=lambda row: row["batch"])
    actor = scheduler.spawn("caught-up-driver", lambda: actors.driver(
        world, DriverSpec(version=int(newest["version"]), budget=schedule.inputs + 1), "caught-up-driver"))
    scheduler.run()
    return actor


def _newest_lineage_revived(world: World, error: BaseException) -> bool:
    """Whether the newest lineage's start claimed its generation before the abort decision
    `error` names: the window of an abort in flight against a restore of the lineage it
    abandons, whose start died before it could be refused (docs/PROTOCOL.md)."""
    origins = world.raw_catalog().origins()
    if not origins:
        return False
    key = f"store:put_if_absent {JOB}/lineage/{origins[-1].generation:012d}.json"
    starter = next((a for a, w in world.writes.ordered if w == key), None)
    return starter is not None and _aborted_after_claim(world, starter, error)


def _aborted_after_claim(world: World, name: str, error: BaseException) -> bool:
    """Whether `error` refuses `name`'s start because a confirmed transaction of its
    restart point was aborted *after* `name` claimed its generation: by an actor fenced
    then, in the one act its fence check allowed (docs/PROTOCOL.md, "The windows left")."""
    import re

    found = re.search(r"transaction (\S+) \(batch \d+\), which .* was aborted since", str(error))
    if not isinstance(error, SinkLineageError) or found is None:
        return False
    claim = world.writes.index(name, f"store:put_if_absent {JOB}/generations/")
    decided = next((i for i, (_a, w) in enumerate(world.writes.ordered)
                    if w.startswith("sink:put_if_absent _sparkpoint/decisions/") and found.group(1) in w),
                   None)
    return claim is not None and decided is not None and decided > claim


def _aborted_by_a_fenced_run(world: World, error: BaseException) -> bool:
    """Whether `error` is a commit refused because its transaction's abort was decided by
    a run already fenced then: one that passed its last fence check before a newer claim
    and decided in the one act it allowed; its record stays (the check before deleting
    it fails), so the newer lineage refuses that batch and those after it instead of
    losing it (docs/PROTOCOL.md, "The windows left")."""
    import re

    from airflow_sparkpoint.exceptions import SinkError

    found = re.search(r"transaction (\S+) was aborted \(decision at", str(error))
    if not isinstance(error, SinkError) or found is None:
        return False
    decided = next((i for i, (_a, w) in enumerate(world.writes.ordered)
                    if w.startswith("sink:put_if_absent _sparkpoint/decisions/") and found.group(1) in w),
                   None)
    if decided is None:
        return False
    writer = world.writes.ordered[decided][0]
    claims = [(i, int(w.rsplit("/", 1)[1])) for i, (a, w) in enumerate(world.writes.ordered)
              if w.startswith(f"store:put_if_absent {JOB}/generations/")]
    own = [g for i, g in claims if world.writes.ordered[i][0] == writer]
    return bool(own) and any(g > max(own) and i < decided for i, g in claims)


def _check_cutovers(world: World, scheduler: Scheduler, schedule: Schedule) -> None:
    """Every cutover ended one way: never both claimed by green and called off; a green
    that lost the decision to a call-off wrote no origin (its claim only fenced a stopped
    blue); a ``claimed`` record is the decided claim's."""
    from airflow_sparkpoint.checkpoints.cutover import CutoverStore

    catalog = world.raw_catalog()
    store = CutoverStore(catalog)
    for cid in store.ids():
        state = store.read(cid)
        taken, ended, decided = state.taken, state.ended, state.decision
        if taken is not None and ended is not None and ended.outcome == "aborted":
            _fail(schedule, scheduler,
                  f"cutover {cid} is claimed by generation {taken.generation} and called off "
                  f"({ended.step}: {ended.reason})")
        if decided is not None and state.claimed is not None and decided.claim != state.claimed:
            _fail(schedule, scheduler,
                  f"cutover {cid}'s claimed record {state.claimed} is not its decision {decided}")
        if decided is not None and decided.outcome == "abort":
            adopted = [o.generation for o in catalog.origins() if o.restore.get("cutover") == cid
                       and not o.restore.get("rollback_of")]
            if adopted:
                _fail(schedule, scheduler, f"cutover {cid} was called off, yet generation(s) {adopted} wrote "
                                           "green's origin")


def _check_end(world: World, scheduler: Scheduler, schedule: Schedule) -> None:
    sink = world.raw_sink()
    by_batch = _rows_by_batch(world, sink)
    want = list(range(schedule.inputs))
    if sorted(by_batch) != want:
        missing = sorted(set(want) - set(by_batch))
        extra = sorted(set(by_batch) - set(want))
        _fail(schedule, scheduler, f"the sink holds batches {sorted(by_batch)}; expected {want} "
                                   f"(missing {missing}, unexpected {extra})")
    versions: dict[int, int] = {}
    for batch, rows in sorted(by_batch.items()):
        generations = {row["generation"] for row in rows}
        found = {row["version"] for row in rows}
        if len(generations) != 1 or len(found) != 1:
            _fail(schedule, scheduler,
                  f"batch {batch} mixes generations {sorted(generations)} / versions {found}")
        versions[batch] = found.pop()
        green = generations & set(world.green_rolled_back)
        if green:
            _fail(schedule, scheduler, f"batch {batch} is from generation {sorted(green)}, a cutover's green "
                                       "rolled back to blue's final savepoint: nothing of it may stay")
    expected = sorted(tuple(sorted(r.items())) for r in expected_rows(versions))
    got = sorted(tuple(sorted((k, v) for k, v in r.items() if k != "generation")) for r in visible_rows(sink))
    if got != expected:
        diff = sorted(set(got) ^ set(expected))[:6]
        _fail(schedule, scheduler, "the sink's rows are not one lineage's output of the input (a batch lost, "
                                   f"repeated or from another lineage's state); first differences: {diff}")
    catalog = world.raw_catalog()
    left = catalog.transactions()
    if left:
        _fail(schedule, scheduler, f"transaction records left after the end: {[r.txn_id for r in left]}")
    staged = _staged_left(world)
    if staged:
        _fail(schedule, scheduler, f"staged data left after the end: {staged[:6]}")


def _staged_left(world: World) -> list[str]:
    """Staging areas no committed batch uses (a Delta append's files stay where they
    were staged: the table references them)."""
    in_use: set[str] = set()
    if world.sink_kind in DELTA_KINDS:
        from airflow_sparkpoint.sinks import _delta_txn

        root = os.path.join(world.output, "_sparkpoint_txn", JOB)
        table = world.raw_sink()._table()  # type: ignore[attr-defined]
        prefix = f"_sparkpoint_txn/{JOB}/"
        if table is not None:
            in_use = {p[len(prefix):].split("/", 1)[0] for p in _delta_txn.table_paths(table)
                      if p.startswith(prefix)}
    else:
        root = os.path.join(world.output, "_staging")
    try:
        return sorted(set(os.listdir(root)) - in_use)
    except FileNotFoundError:
        return []


def _fail(schedule: Schedule, scheduler: Scheduler, message: str) -> None:
    chooser = getattr(scheduler, "explored", scheduler.chooser)
    directives = "".join(f"\n  {line}" for line in getattr(chooser, "describe", list)())
    raise Violation(f"{message}\n\nschedule: {schedule.describe()}{directives}\n\ntrace "
                    f"({scheduler.steps} steps):\n"
                    + scheduler.format_trace(last=400))
