"""The actors of the simulation: each runs the product's real code for one use case.

* `Driver`: a real `runtime.job._Run` (claim, restore planning and recovery, the
  coordinator's checkpoints, retention and commits, control requests, the status and
  the result) whose streaming query is the model's (`model.ModelQuery`) instead of Spark's;
* `commit_step`, `savepoint`, `savepoint_retention`, `rollback`: the use cases the CLI and
  the operators run, called as they call them;
* `cutover`: a zero-downtime cutover (issue 49) as the orchestrator and green run it: the
  plan, blue's ``stop_after`` request and the agreement, then green's claim and adoption
  (`runtime.cutover.adopt`) and green's run from the agreed batch on (a driver of other
  code naming the cutover), or the call-off when blue did not stop at the batch;
* `call_off_actor`: the orchestrator's call-off of the open cutover on a bound or a
  killed task (`on_kill`, `sparkpoint cutover call-off`), at a moment it chooses: racing
  the agreement, blue's stop or green's claim.
"""

from __future__ import annotations

import types
import uuid
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverStore, new_cutover_id
from airflow_sparkpoint.exceptions import (
    ControlError,
    CutoverError,
    RestoreError,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.runtime.job import _Run, _StopRun
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.services.cutover import call_off, stop_after_batch
from airflow_sparkpoint.services.dispose import dispose_savepoints
from airflow_sparkpoint.services.rollback import abort_stopped_generation
from airflow_sparkpoint.services.savepoint import take_savepoint
from airflow_sparkpoint.storage import MemoryStorage
from tests.simulation.model import ModelQuery
from tests.simulation.scheduler import Crash
from tests.simulation.world import JOB, World

#: the heartbeat age past which a run counts as gone (the operators' default)
MAX_HEARTBEAT_AGE_S = 60.0


@dataclass(frozen=True)
class DriverSpec:
    """One start of the job (a task try, a deploy, a restore by hand)."""

    restore: str = "latest"  # latest | none | path (a snapshot chosen when it starts) | moved (a
    # savepoint chosen when it starts, copied outside the job's root on its service, restored by path)
    sink_ahead: str = "fail"
    commit_mode: str = "checkpoint"
    version: int = 1  # the job code's version (a deploy changes it)
    budget: int = 3  # batches it finds input for before it ends (availableNow)
    num_retained: int = 2
    interval_s: float = 0.0
    timeout_s: float = 600.0  # checkpoint.timeout: also the grace before orphaned shared files go
    cutover: str = ""  # the open cutover this start is green's (spark.sparkpoint.cutover)

    def describe(self) -> str:
        parts = [f"restore={self.restore}", f"v{self.version}", f"{self.budget} batches"]
        if self.cutover:
            parts.append(f"cutover={self.cutover}")
        if self.sink_ahead != "fail":
            parts.append(f"sinkAhead={self.sink_ahead}")
        if self.commit_mode != "checkpoint":
            parts.append(self.commit_mode)
        if self.interval_s:
            parts.append(f"interval={self.interval_s:g}s")
        if self.timeout_s != 600.0:
            parts.append(f"timeout={self.timeout_s:g}s")
        parts.append(f"numRetained={self.num_retained}")
        return ", ".join(parts)


class _FakeSpark:
    """What `_Run` asks of its SparkSession outside the query (the model has no JVM)."""

    version = "4.2.0"

    def __init__(self, name: str) -> None:
        conf = types.SimpleNamespace(getAll=list)
        self.sparkContext = types.SimpleNamespace(applicationId=f"sim-{name}", uiWebUrl=None,
                                                  getConf=lambda: conf)
        self.conf = types.SimpleNamespace(get=lambda key, default=None: default)


class SimRun(_Run):
    """`_Run` with the model's query: staging, the coordinator's events and the end of
    the run are `_Run`'s own code, in the order its threads run them."""

    def __init__(self, world: World, spec: DriverSpec, name: str, restore: str) -> None:
        settings = {
            "spark.sparkpoint.dir": world.root,
            "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.workDir": world.work,
            "spark.sparkpoint.restore": restore,
            "spark.sparkpoint.restore.force": "true",
            "spark.sparkpoint.restore.sinkAhead": spec.sink_ahead,
            "spark.sparkpoint.commit.mode": spec.commit_mode,
            "spark.sparkpoint.checkpoint.interval": f"{spec.interval_s:g}s",
            "spark.sparkpoint.checkpoint.numRetained": str(spec.num_retained),
            "spark.sparkpoint.checkpoint.timeout": f"{spec.timeout_s:g}s",
            "spark.sparkpoint.takeover": "true",
            "spark.sparkpoint.stateStore": "hdfs",
            "spark.sparkpoint.control.pollInterval": "1s",
            "spark.sparkpoint.codeVersion": f"v{spec.version}",
        }
        if spec.cutover:
            settings["spark.sparkpoint.cutover"] = spec.cutover
        config = SparkpointConfig.from_conf(settings)
        self.world = world
        self.spec = spec
        self.name = name
        job = types.SimpleNamespace(config=config, spark=_FakeSpark(name))
        self.model = ModelQuery(live="", inputs=world.inputs, version=spec.version, generation=0,
                                point=world.scheduler.point)
        super().__init__(job, self.model, world.sink(), "append", None)  # type: ignore[arg-type]

    def _run_query(self) -> Any:
        run, model = self.state, self.model
        model.live, model.generation = run.live, run.generation
        run.query = model  # type: ignore[assignment]
        next_poll = 0.0
        done = False

        def event(kind: str, value: int | None) -> None:
            nonlocal next_poll, done
            if done:
                return
            try:
                next_poll = self.coordinator.handle(kind, value, next_poll)
            except Crash:
                raise
            except BaseException as exc:  # noqa: BLE001 - `RunCoordinator.run`'s own handling
                self.coordinator.failed(exc)
                done = True

        query_error: BaseException | None = None
        try:
            try:
                for count in range(self.spec.budget):
                    if run.stopping.is_set() or run.error is not None or model.stopped:
                        break
                    batch = model.next_batch()
                    if batch is None:
                        break
                    try:
                        self.stage_batch(model.frame(batch), batch)  # type: ignore[arg-type]
                    except _StopRun:
                        break
                    model.commit(batch)
                    if count == 0:
                        self.remove_earlier_live()  # the cleanup thread, once the query runs
                    event("progress", batch)
                    event("tick", None)
            except Crash:
                raise
            except Exception as exc:  # noqa: BLE001 - the query failed (foreachBatch raised)
                query_error = exc
            run.query_failed = query_error is not None
            event("final", None)
            return self.conclude(query_error)
        finally:
            run.checkpointer.close()
            run.release_live()


def driver(world: World, spec: DriverSpec, name: str) -> Any:
    """Start the job as `spec` says; the result is the run's `RunResult` (or it raises)."""
    restore = spec.restore
    if restore == "path":
        snapshots = _snapshots(world)
        restore = world.scheduler.choose("restore target", snapshots) if snapshots else "latest"
    elif restore == "moved":
        restore = _moved_savepoint(world)
    run = SimRun(world, spec, name, restore)
    actor = world.scheduler.current()
    if actor is not None:
        actor.on_crash.append(run.state.release_live)  # the OS drops a dead process's locks
    try:
        return run.execute()
    except Exception as exc:
        generation = run.claimed_generation
        # read unscheduled: was this run superseded when it failed (a zombie's failure is its fence)?
        exc.superseded = generation is not None and world.raw_catalog().current_generation() > generation  # type: ignore[attr-defined]
        raise


def _snapshots(world: World) -> list[str]:
    """Every complete checkpoint and savepoint of the job now, by URI (a person reading
    `sparkpoint list`), valid or not: the restore refuses what it must."""
    catalog = world.raw_catalog()
    found = [f"{catalog.uri}/chk-{cid}" for cid in catalog.checkpoint_ids()
             if catalog.store.exists(f"chk-{cid}/_metadata")]
    found += [entry.uri for entry in catalog.list_savepoints() if entry.metadata is not None]
    return found


def _moved_savepoint(world: World) -> str:
    """A person copies one of the job's savepoints (chosen) outside the job's root, on the
    same service (``<store>/moved/<n>``), to restore it by path: its URI (``latest`` when
    there is no savepoint). The copy is a person's, made whole before the start."""
    catalog = world.raw_catalog()
    savepoints = [entry.key for entry in catalog.list_savepoints() if entry.metadata is not None]
    checkpoints = [f"chk-{cid}" for cid in catalog.checkpoint_ids()
                   if catalog.store.exists(f"chk-{cid}/_metadata")]
    if not savepoints and not checkpoints:
        return "latest"
    key = world.scheduler.choose("moved savepoint", savepoints + checkpoints)
    target = uuid.uuid4().hex[:8]
    if key.startswith("chk-"):  # `sparkpoint savepoint` of that checkpoint into another root, then moved
        try:
            handle = catalog.snapshot(int(key[len("chk-"):]))
            moved = Catalog(MemoryStorage(world.store_name), "moved").create_savepoint(handle, key=target)
        except (RestoreError, StorageError):
            return "latest"  # damaged or removed meanwhile: nothing to move
        return moved.uri
    raw = MemoryStorage(world.store_name)
    source = catalog.store.child(key)
    for info in list(source.list()):
        raw.put(f"moved/{target}/{info.key}", source.get(info.key))
    return f"{world.root}/moved/{target}"


def commit_step(world: World, upto: int | None = None) -> Any:
    """`sparkpoint commit` / `SparkpointCommitOperator` with the job's sink declared."""
    return commit_pending(world.catalog(), sink=world.sink(), upto_batch=upto)


def savepoint(world: World, stop: bool) -> Any:
    """`sparkpoint savepoint [--stop]` / `SparkpointSavepointOperator`: ask the live run,
    else copy the latest completed checkpoint."""
    return take_savepoint(world.catalog(), stop=stop, timeout_s=300.0, poll_s=2.0,
                          max_heartbeat_age=MAX_HEARTBEAT_AGE_S, requested_by="simulation").uri


def savepoint_retention(world: World, keep: int) -> Any:
    """`sparkpoint dispose --keep N` (the savepoint operator's history retention is the
    same pass, its failures only logged). Whether it ends or dies, a blue's final
    savepoint that went during it is noted as released when the rule let it go
    (`released_final_savepoints`)."""
    before = {e.uri for e in world.raw_catalog().list_savepoints() if e.metadata is not None}
    position = world.raw_sink().committed_position(JOB)
    try:
        return dispose_savepoints(world.catalog(), keep=keep, older_than_s=None).disposed
    finally:
        world.final_savepoints_released |= released_final_savepoints(world, before, position)


def released_final_savepoints(world: World, before: set[str], position: int | None = None) -> set[str]:
    """Of the savepoints `before` (valid when a retention pass started) that are gone now,
    those that are blue's final savepoint S of a claimed cutover that no rollback
    returned to at some point of the pass: a generation after green's started another
    lineage (`cutover_of_lineage` of its origin is not the cutover), or green's lineage
    committed past N (the sink, read when the pass started, `position`, or now, is past
    N: before the claim it is at N, `adopt`; a rollback of green then finds it ahead of
    S). Read unscheduled, from the sink itself, not the commit head the rule reads."""
    from airflow_sparkpoint.checkpoints.cutover_lineage import cutover_of_lineage

    catalog = world.raw_catalog()
    gone = before - {e.uri for e in catalog.list_savepoints() if e.metadata is not None}
    if not gone:
        return set()
    now = world.raw_sink().committed_position(JOB)
    committed = max((p for p in (position, now) if p is not None), default=None)
    released = set()
    for state in (CutoverStore(catalog).read(cid) for cid in CutoverStore(catalog).ids()):
        claim = state.taken
        if claim is None or claim.savepoint not in gone:
            continue
        later = [o.generation for o in catalog.origins() if o.generation > claim.generation]
        if (committed is not None and committed > claim.batch_id) or \
                any(getattr(cutover_of_lineage(catalog, g), "id", None) != state.id for g in later):
            released.add(claim.savepoint)
    return released


def check_rolled_back_to_savepoint(world: World, generation: int) -> None:
    """After a rollback of `generation`: when it returned the lineage to a savepoint and
    `generation` is a cutover's green, that savepoint is blue's final one of N (green's
    claim names it), and from then on no batch of green's may be in the sink at the end
    (`world.green_rolled_back`, checked by `simulate._check_end`). Read unscheduled."""
    from airflow_sparkpoint.services.cutover import cutover_of_generation

    catalog = world.raw_catalog()
    state = cutover_of_generation(catalog, generation)
    if state is None or state.claimed is None:
        return
    origin = next((o for o in catalog.origins() if o.restore.get("rollback_of") == generation
                   and o.generation > generation), None)
    if origin is None or origin.kind != "savepoint":
        return
    if (origin.uri, origin.batch_id) != (state.claimed.savepoint, state.claimed.batch_id):
        raise AssertionError(f"the rollback of cutover {state.id}'s green (generation {generation}) returned "
                             f"to {origin.describe()}, not blue's final savepoint {state.claimed.savepoint} "
                             f"of batch {state.claimed.batch_id}")
    world.green_rolled_back[generation] = state.claimed.batch_id


def rollback(world: World) -> Any:
    """`sparkpoint commit --abort-generation G` (a blue-green rollback) of a generation
    chosen among those claimed now."""
    generations = world.raw_catalog().generations()
    if not generations:
        return []
    generation = world.scheduler.choose("generation to roll back", generations)
    try:
        aborted = abort_stopped_generation(world.catalog(), generation, max_heartbeat_age=MAX_HEARTBEAT_AGE_S,
                                           how_to_stop="stop it", sink=world.sink())
        check_rolled_back_to_savepoint(world, generation)
        return aborted
    except StaleGeneration:
        return "superseded"
    except RestoreError as exc:
        origins = world.raw_catalog().origins()
        if origins and origins[-1].generation == generation and "is gone" in str(exc):
            # retention keeps where a rollback of the newest lineage returns to
            raise AssertionError(
                f"the rollback of newest generation {generation} lost its point: {exc}") from exc
        raise


@dataclass(frozen=True)
class CutoverSpec:
    """A zero-downtime cutover: N is blue's last confirmed batch + `margin`; green runs
    code `version` for `budget` batches after its claim."""

    margin: int = 1
    version: int = 2
    budget: int = 2
    num_retained: int = 6  # green's checkpoint.numRetained (1: green's retention retires blue's X soon)

    def describe(self) -> str:
        retained = "" if self.num_retained == 6 else f", numRetained={self.num_retained}"
        return f"cutover(N=last+{self.margin}, green v{self.version}, {self.budget} batches{retained})"


def cutover(world: World, spec: CutoverSpec, name: str) -> Any:
    """The orchestrator and green of one cutover (see the module docstring). Green's
    warm-up is not modelled (the runtime's follow mode is its own actor's work): green
    adopts blue's final checkpoint, which is what green's state at N must equal."""
    from airflow_sparkpoint.services.savepoint import savepoint_source

    catalog = world.catalog()
    for _ in range(60):  # the orchestrator waits for blue's first checkpoint (green warms up from it)
        source = savepoint_source(catalog, MAX_HEARTBEAT_AGE_S)
        if source.run is not None and catalog.latest() is not None:
            break
        if source.status is not None and source.status.state in ("finished", "stopped", "failed"):
            return "blue ended"
        world.scheduler.clock.sleep(1.0)  # virtual time: a point
    else:
        return "no live blue with a checkpoint"
    cid = None
    for _attempt in range(3):  # blue already past N: a new cutover with a larger N, a few times
        cid, outcome = _agree_and_stop(world, catalog, spec, name)
        if outcome != "past":
            break
    if outcome != "stopped":
        return outcome
    assert cid is not None
    store = CutoverStore(catalog)
    try:
        adoption = adopt(world.catalog(), world.sink(), cid, live_dir=None)
    except CutoverError as exc:
        try:
            call_off_checked(world, catalog, cid, reason=str(exc), by=name)
        except CutoverError:
            pass  # claimed after all: green's retry (the end of the schedule) continues it
        return "refused"
    green = DriverSpec(restore="latest", version=spec.version, budget=spec.budget, cutover=cid,
                       num_retained=spec.num_retained)
    driver(world, green, f"{name}-green")  # raises when green's run failed: the cutover stays open
    store.end(cid, "committed", step="first_commit", generation=adoption.generation, by=name)
    check_final_savepoint(world, cid)
    return f"green took over at batch {adoption.batch_id}"


def check_final_savepoint(world: World, cid: str) -> None:
    """After green's run: blue's final savepoint of N, named by green's claim, is a valid
    savepoint of N by blue, whatever green's checkpoint retention removed (blue's final
    checkpoint X included) and whatever savepoint history retention ran: it may remove S
    only once another lineage than green's was the newest (`released_final_savepoints`),
    never from blue's stop through green's claim nor while green's lineage is the newest.
    Read unscheduled."""
    catalog = world.raw_catalog()
    state = CutoverStore(catalog).read(cid)
    claim = state.claimed
    assert claim is not None, f"cutover {cid} has no claim after green's run"
    if claim.savepoint is None:
        raise AssertionError(f"cutover {cid}: green's claim names no final savepoint of blue's")
    if claim.savepoint in world.final_savepoints_released:
        return
    entry = next((e for e in catalog.list_savepoints() if e.uri == claim.savepoint), None)
    meta = entry.metadata if entry is not None else None
    if meta is None or (meta.batch_id, meta.generation) != (claim.batch_id, state.plan.blue_generation):
        raise AssertionError(f"cutover {cid}: blue's final savepoint {claim.savepoint} of batch "
                             f"{claim.batch_id} is gone or not blue's at N "
                             f"({entry.error if entry is not None else 'not listed'})")


#: when the call-off actor calls the open cutover off: once planned, once agreed, or once
#: blue completed its stop after N (then it races green's claim)
CALL_OFF_AT = ("planned", "agreed", "stopped", "stopped")


def call_off_actor(world: World, name: str) -> Any:
    """Call the job's open cutover off (`call_off`, checked as `call_off_checked`) at the
    moment it chose (`CALL_OFF_AT`); refused with `CutoverError` when green's claim was
    decided first. Returns what it did."""
    catalog = world.catalog()
    store = CutoverStore(catalog)
    at = world.scheduler.choose("call off at", list(CALL_OFF_AT))
    for _ in range(90):
        state = store.open_cutover()
        agreed = state.agreed if state is not None else None
        if state is not None and (at == "planned" or (agreed is not None and (
                at == "agreed" or _taken_or_gone(catalog, agreed.request_id)))):
            end = call_off_checked(world, catalog, state.id, reason=f"a bound passed ({at})", by=name)
            return f"called off: {end.outcome} at {end.step}"
        world.scheduler.clock.sleep(1.0)  # virtual time: a point
    return "no open cutover to call off"


def _taken_or_gone(catalog: Any, request_id: str) -> bool:
    try:
        return ControlChannel(catalog).result(request_id).state != "pending"
    except ControlError:
        return True


def call_off_checked(world: World, catalog: Any, cid: str, *, reason: str, by: str) -> Any:
    """`call_off`, then the check that it leaves no ``stop_after`` of the cutover that a
    run could still take (pending: neither taken nor withdrawn). Read unscheduled."""
    end = call_off(catalog, cid, reason=reason, by=by)
    raw = world.raw_catalog()
    blue = CutoverStore(raw).read(cid).plan.blue_generation
    stray = [r.id for r in ControlChannel(raw).pending(blue) if r.kind == "stop_after" and r.cutover == cid]
    if stray:
        raise AssertionError(f"call_off of cutover {cid} left blue's stop_after request(s) {stray} pending")
    return end


def _agree_and_stop(world: World, catalog: Any, spec: CutoverSpec, name: str) -> tuple[str | None, str]:
    """Plan a cutover from blue's newest checkpoint, agree on N = its last batch +
    `spec.margin`, ask blue to stop after N and wait: ``(cutover id, "stopped")``, or the
    cutover called off (``"past"`` when blue was already past N)."""
    from airflow_sparkpoint.checkpoints.history import generation_alive
    from airflow_sparkpoint.services.savepoint import savepoint_source

    source = savepoint_source(catalog, MAX_HEARTBEAT_AGE_S)
    latest = catalog.latest()
    if source.run is None or latest is None:
        return None, "no live blue"
    blue = source.run.generation
    cid = new_cutover_id()
    store = CutoverStore(catalog)
    try:
        store.plan(CutoverPlan(cid, JOB, blue, catalog.checkpoint_uri(latest.id), latest.batch_id,
                               f"{JOB}-shadow", f"{world.root}/shadow", requested_by=name))
    except CutoverError:
        return None, "another cutover is open"
    n = (source.run.last_batch if source.run.last_batch is not None else latest.batch_id) + spec.margin
    try:
        asked = stop_after_batch(catalog, max(0, n), timeout_s=300.0, poll_s=2.0,
                                 max_heartbeat_age=MAX_HEARTBEAT_AGE_S, requested_by=name, wait=False,
                                 generation=blue, cutover_id=cid)
        store.agree(cid, max(0, n), asked.request_id)
        ControlChannel(catalog).wait(asked.request_id, timeout_s=300.0, poll_s=2.0,
                                     is_alive=lambda: generation_alive(catalog, blue, MAX_HEARTBEAT_AGE_S))
    except Exception as exc:  # noqa: BLE001 - refused, failed, expired, blue gone: the cutover is off
        call_off_checked(world, catalog, cid, reason=f"blue did not stop after batch {n}: {exc}", by=name)
        return cid, "past" if "already past" in str(exc) else "called off"
    return cid, "stopped"
