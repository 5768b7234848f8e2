"""The zero-downtime cutover (issue 49) in the simulation, pinned: blue (a0) is held
before it stages batch 2 until the orchestrator (a1) filed its ``stop_after`` request;
then blue serves it, stops after the agreed batch, and green claims and continues with
other code. The schedule's own checks (every batch once, one lineage's rows, nothing
left) hold; these tests add what each path must have done."""

from __future__ import annotations

from typing import Any

import pytest

from tests.simulation import actors
from tests.simulation.actors import CutoverSpec, DriverSpec
from tests.simulation.scheduler import Pause, ScriptedChooser
from tests.simulation.simulate import ActorSpec, Schedule, run_schedule


@pytest.fixture()
def outcomes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    found: list[Any] = []
    real = actors.cutover

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        result = real(world, spec, name)
        found.append(result)
        return result

    monkeypatch.setattr(actors, "cutover", cutover)
    return found


def _schedule(sink: str, margin: int, *rest: ActorSpec) -> Schedule:
    return Schedule(sink, 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                              ActorSpec("cutover", cutover=CutoverSpec(margin=margin, version=2, budget=3)),
                              *rest))


HOLD_BLUE = Pause("a0", ("sink.stage",), until="a1", release=("put_if_absent sim/control/",), occurrence=3)


@pytest.mark.parametrize("sink", ["directory", "delta"])
def test_green_takes_over_after_the_agreed_batch(sink: str, outcomes: list[Any]) -> None:
    run_schedule(_schedule(sink, 1), ScriptedChooser([HOLD_BLUE]))
    assert outcomes == ["green took over at batch 2"]


def test_a_stop_after_below_the_started_batch_is_refused_and_blue_keeps_running(outcomes: list[Any]) -> None:
    """N = blue's last batch - 1: blue refuses (already past N) and runs on; the
    orchestrator calls the cutover off, tries again with a larger N (a new cutover)."""
    outcome = run_schedule(_schedule("directory", -1), ScriptedChooser([HOLD_BLUE]))
    refusals = [line for line in outcome.trace if "refused stop_after request" in line]
    assert refusals and "already past batch 0: batch 2 has started" in refusals[0]
    assert not any("a0-driver failed" in line for line in outcome.trace)
    assert len(outcomes) == 1  # then a new cutover with a larger N, or blue drained first


# -- blue's final savepoint at N (the stop after the agreed batch ends with one) ---------------


def _final_savepoint(catalog: Any, batch: int, generation: int) -> str | None:
    """The URI of a valid savepoint of `batch` by `generation` (``sparkpoint list``), or None."""
    found = [e.uri for e in catalog.list_savepoints()
             if e.metadata is not None
             and (e.metadata.batch_id, e.metadata.generation) == (batch, generation)]
    return found[0] if found else None


def _cutover_state(catalog: Any) -> Any:
    from airflow_sparkpoint.checkpoints.cutover import CutoverStore

    store = CutoverStore(catalog)
    return store.read(store.ids()[-1])


@pytest.mark.parametrize("sink", ["directory", "delta"])
def test_blue_s_final_savepoint_of_n_survives_green_s_retention(
    sink: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blue's stop after N ends with a savepoint of N (under savepoints/, listed), named by
    the request's result and the cutover's claim; green's checkpoint retention (one
    retained, three batches) retires blue's final checkpoint X but never the savepoint."""
    seen: list[Any] = []
    real = actors.cutover

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        result = real(world, spec, name)
        catalog = world.raw_catalog()
        state = _cutover_state(catalog)
        claim = state.claimed
        assert claim is not None, state
        savepoint = _final_savepoint(catalog, claim.batch_id, state.plan.blue_generation)
        final_id = int(claim.checkpoint.rsplit("chk-", 1)[1])
        seen.append((result, final_id in catalog.checkpoint_ids(), savepoint,
                     state.to_json().get("blue_savepoint")))
        return result

    monkeypatch.setattr(actors, "cutover", cutover)
    schedule = Schedule(sink, 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                                  ActorSpec("cutover",
                                            cutover=CutoverSpec(margin=1, budget=3, num_retained=1))))
    run_schedule(schedule, ScriptedChooser([HOLD_BLUE]))
    assert len(seen) == 1
    result, x_left, savepoint, named = seen[0]
    assert result == "green took over at batch 2"
    assert not x_left, "green's retention did not retire blue's final checkpoint: the test proves nothing"
    assert savepoint is not None, "blue left no savepoint of batch 2"
    assert named == savepoint


@pytest.mark.parametrize("sink", ["directory", "delta"])
def test_a_rollback_after_the_cutover_restores_blue_s_final_savepoint(
    sink: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Green claims at N and commits nothing past it (no input for it yet); the rollback
    of green's generation returns the job's lineage to blue's final savepoint: the next
    ``restore=latest`` restores blue's state at N from it, and the sink ends exactly as
    blue's lineage left it at N plus the restart's batches, nothing of green's."""
    from airflow_sparkpoint.services.rollback import abort_stopped_generation
    from tests.simulation import simulate

    seen: dict[str, Any] = {}
    real = actors.cutover

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        result = real(world, spec, name)
        catalog = world.raw_catalog()
        state = _cutover_state(catalog)
        assert state.claimed is not None, state
        # green's run: the claim's generation, here run on by green's start (restore=latest) after it
        greens, n = {state.claimed.generation, catalog.current_generation()}, state.claimed.batch_id
        abort_stopped_generation(world.catalog(), catalog.current_generation(),
                                 max_heartbeat_age=actors.MAX_HEARTBEAT_AGE_S, how_to_stop="stop it",
                                 sink=world.sink())
        after = _cutover_state(catalog)
        seen.update(result=result, greens=greens, n=n, blue=state.plan.blue_generation,
                    savepoint=_final_savepoint(catalog, n, state.plan.blue_generation),
                    origin=catalog.origins()[-1], shown=after.to_json())
        return result

    real_end = simulate._check_end

    def check_end(world: Any, scheduler: Any, schedule: Any) -> None:
        real_end(world, scheduler, schedule)
        seen["final_origin"] = world.raw_catalog().origins()[-1]
        seen["rows"] = simulate._rows_by_batch(world, world.raw_sink())

    monkeypatch.setattr(actors, "cutover", cutover)
    monkeypatch.setattr(simulate, "_check_end", check_end)
    schedule = Schedule(sink, 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                                  ActorSpec("cutover", cutover=CutoverSpec(margin=1, budget=0))))
    run_schedule(schedule, ScriptedChooser([HOLD_BLUE]))
    assert seen["result"] == "green took over at batch 2"
    savepoint, n = seen["savepoint"], seen["n"]
    assert savepoint is not None, "blue left no savepoint of batch N"
    origin = seen["origin"]  # the rollback's: the lineage returns to blue's savepoint
    assert (origin.kind, origin.uri, origin.batch_id) == ("savepoint", savepoint, n), origin
    assert seen["shown"]["rolled_back_to"] == savepoint
    final = seen["final_origin"]  # restore=latest after the rollback restored it
    assert (final.kind, final.uri, final.batch_id) == ("savepoint", savepoint, n), final
    rows = seen["rows"]
    assert sorted(rows) == list(range(6))
    owners = {batch: {row["generation"] for row in batch_rows} for batch, batch_rows in rows.items()}
    assert all(owners[b] == {seen["blue"]} for b in range(n + 1)), owners
    assert all(not (seen["greens"] & owners[b]) for b in owners), owners


def test_call_off_before_the_agreement_withdraws_blue_s_stop_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestrator filed blue's ``stop_after`` and died before ``agreed``; the
    call-off withdraws the request (it names the cutover), so blue, which had not taken
    it yet, never stops after N: it runs on and drains its input."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverStore, new_cutover_id
    from airflow_sparkpoint.services.cutover import call_off, stop_after_batch
    from airflow_sparkpoint.services.savepoint import savepoint_source
    from tests.simulation.world import JOB

    seen: dict[str, Any] = {}

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        catalog = world.catalog()
        for _ in range(60):  # as the orchestrator: blue runs and has a checkpoint to warm up from
            source, latest = savepoint_source(catalog, actors.MAX_HEARTBEAT_AGE_S), catalog.latest()
            if source.run is not None and latest is not None:
                break
            world.scheduler.clock.sleep(1.0)
        assert source.run is not None and latest is not None
        blue = source.run.generation
        cid = new_cutover_id()
        CutoverStore(catalog).plan(CutoverPlan(cid, JOB, blue, catalog.checkpoint_uri(latest.id),
                                               latest.batch_id,
                                               f"{JOB}-shadow", f"{world.root}/shadow", requested_by=name))
        asked = stop_after_batch(catalog, latest.batch_id + 3, timeout_s=300.0, poll_s=2.0,
                                 max_heartbeat_age=actors.MAX_HEARTBEAT_AGE_S, requested_by=name, wait=False,
                                 generation=blue, cutover_id=cid)
        # the orchestrator dies here (fault point cutover_agreement): no agreed record
        call_off(catalog, cid, reason="the orchestrator's retry calls it off", by=name)
        channel = ControlChannel(catalog)
        seen.update(request=asked.request_id, pending=[r.id for r in channel.pending(blue)],
                    state=channel.result(asked.request_id).state)
        return "called off"

    monkeypatch.setattr(actors, "cutover", cutover)
    hold = Pause("a0", ("sink.stage",), until="a1", occurrence=3)  # blue takes nothing until a1 ended
    run_schedule(_schedule("directory", 1), ScriptedChooser([hold]))
    assert seen["pending"] == [], f"call_off left blue's stop_after pending: {seen}"
    assert seen["state"] == "expired", seen  # withdrawn: no run can take it any more


def test_blue_refuses_a_stop_after_whose_cutover_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop_after nobody withdrew in time (the call-off died between its end record and
    the withdrawal): blue takes it, finds its cutover ended, fails it and runs on."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverStore, new_cutover_id
    from airflow_sparkpoint.services.cutover import stop_after_batch
    from airflow_sparkpoint.services.savepoint import savepoint_source
    from tests.simulation import simulate
    from tests.simulation.world import JOB

    seen: dict[str, Any] = {}

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        catalog = world.catalog()
        for _ in range(60):
            source, latest = savepoint_source(catalog, actors.MAX_HEARTBEAT_AGE_S), catalog.latest()
            if source.run is not None and latest is not None:
                break
            world.scheduler.clock.sleep(1.0)
        assert source.run is not None and latest is not None
        blue = source.run.generation
        cid = new_cutover_id()
        store = CutoverStore(catalog)
        store.plan(CutoverPlan(cid, JOB, blue, catalog.checkpoint_uri(latest.id), latest.batch_id,
                               f"{JOB}-shadow", f"{world.root}/shadow", requested_by=name))
        asked = stop_after_batch(catalog, latest.batch_id + 3, timeout_s=300.0, poll_s=2.0,
                                 max_heartbeat_age=actors.MAX_HEARTBEAT_AGE_S, requested_by=name, wait=False,
                                 generation=blue, cutover_id=cid)
        store.end(cid, "aborted", step="warmup", reason="called off", by=name)  # ...and died: not withdrawn
        seen["request"] = asked.request_id
        return "ended"

    real_end = simulate._check_end

    def check_end(world: Any, scheduler: Any, schedule: Any) -> None:
        real_end(world, scheduler, schedule)
        seen["result"] = ControlChannel(world.raw_catalog()).result(seen["request"])

    monkeypatch.setattr(actors, "cutover", cutover)
    monkeypatch.setattr(simulate, "_check_end", check_end)
    hold = Pause("a0", ("sink.stage",), until="a1", occurrence=3)
    run_schedule(_schedule("directory", 1), ScriptedChooser([hold]))
    result = seen["result"]
    assert result.state == "failed" and "ended (aborted at warmup)" in (result.error or ""), result


# -- savepoint history retention beside the cutover (blue's final savepoint S stays) --------


def _retention_beside_cutover(pauses: list[Pause], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Blue (a0), the cutover (a1), a savepoint from the latest checkpoint (a2, newer than
    S: it is taken while no run is live) and ``dispose --keep 1`` (a3, after a2): the
    schedule's own check (`actors.check_final_savepoint`, after green's run) requires S;
    what a3 disposed of and kept is recorded here to prove it judged S."""
    seen: dict[str, Any] = {}
    real = actors.savepoint_retention

    def retention(world: Any, keep: int) -> Any:
        seen["before"] = {e.uri for e in world.raw_catalog().list_savepoints() if e.metadata is not None}
        seen["disposed"] = real(world, keep)
        return seen["disposed"]

    monkeypatch.setattr(actors, "savepoint_retention", retention)
    schedule = Schedule("directory", 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                                         ActorSpec("cutover",
                                                   cutover=CutoverSpec(margin=1, version=2, budget=3)),
                                         ActorSpec("savepoint"), ActorSpec("retention", keep=1)))
    outcome = run_schedule(schedule, ScriptedChooser([HOLD_BLUE, *pauses]))
    seen["trace"] = outcome.trace
    return seen


def test_retention_keeps_blue_s_final_savepoint_between_blue_s_stop_and_green_s_claim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """a2 and a3 run once blue stopped after N, while green (a1) is held right before its
    ``claimed`` record: the only record naming S is blue's request's result, and a
    savepoint of X is newer. Retention keeps S (the cutover is open); on the code before
    it disposed of S and green's claim named a savepoint that was gone."""
    seen = _retention_beside_cutover([Pause("a2", ("",), until="a0"),
                                      Pause("a3", ("",), until="a2"),
                                      Pause("a1", ("claimed.json",), until="a3")], monkeypatch)
    assert len(seen["before"]) == 2, seen["before"]  # S and the newer savepoint of X: S was judged
    assert seen["disposed"] == []


def test_retention_keeps_blue_s_final_savepoint_while_green_s_lineage_is_the_newest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """a2 and a3 run after green's claim, before green's run: the newest lineage is
    green's, so a rollback of green returns to S; S is kept beside a newer savepoint."""
    seen = _retention_beside_cutover([Pause("a2", ("",), until="a1", release=("claimed.json",)),
                                      Pause("a3", ("",), until="a2"),
                                      Pause("a1", ("store.list sim/cutover/",), until="a3", occurrence=3)],
                                     monkeypatch)
    assert len(seen["before"]) == 2, seen["before"]
    assert seen["disposed"] == []


# -- the call-off beside green's claim: one decision stands --------------------------------


def _race_call_off(pauses: list[Pause], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Blue (a0), the cutover (a1: its orchestrator and green) and a call-off (a2, once
    blue took its stop_after), held as `pauses` say; returns the cutover's records after
    the schedule, what a1 and a2 did, and green's origins. The schedule's own checks
    (`simulate._check_cutovers`: never claimed and called off, a green that lost writes no
    origin) run too."""
    from airflow_sparkpoint.checkpoints.cutover import CutoverStore
    from tests.simulation import simulate

    seen: dict[str, Any] = {}
    real_cutover, real_call_off = actors.cutover, actors.call_off_actor

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        seen["a1"] = real_cutover(world, spec, name)
        return seen["a1"]

    def call_off_actor(world: Any, name: str) -> Any:
        try:
            seen["a2"] = real_call_off(world, name)
        except Exception as exc:
            seen["a2"] = exc
            raise
        return seen["a2"]

    real_end = simulate._check_end

    def check_end(world: Any, scheduler: Any, schedule: Any) -> None:
        real_end(world, scheduler, schedule)
        catalog = world.raw_catalog()
        store = CutoverStore(catalog)
        seen["state"] = store.read(store.ids()[0])
        seen["green_origins"] = [o.generation for o in catalog.origins() if o.restore.get("cutover")]

    monkeypatch.setattr(actors, "cutover", cutover)
    monkeypatch.setattr(actors, "call_off_actor", call_off_actor)
    monkeypatch.setattr(simulate, "_check_end", check_end)
    schedule = Schedule("directory", 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                                         ActorSpec("cutover", cutover=CutoverSpec(margin=1, budget=2)),
                                         ActorSpec("calloff")))
    # a2 chooses to call off once blue took the request ("stopped")
    run_schedule(schedule, ScriptedChooser([HOLD_BLUE, *pauses], options=[2]))
    return seen


GREEN_BEFORE_DECIDING = Pause("a1", ("put_if_absent sim/cutover/",), until="a2",
                              release=("put_if_absent sim/cutover/",), occurrence=3)


def test_a_call_off_after_green_s_decision_is_refused_and_green_s_claim_stands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The call-off read the cutover open, then waits before its decision until green
    decided and wrote its origin: its decision is green's claim, it raises (green's
    claim stands) and ends nothing; green's run commits as the job."""
    # a1 (green) waits before its decision (its 3rd cutover record: plan, agreed, decision)
    # until a2 is at its own; both wait, the older pause gives way: green decides first,
    # and a2 goes on once green wrote its origin
    seen = _race_call_off([GREEN_BEFORE_DECIDING,
                           Pause("a2", ("put_if_absent sim/cutover/",), until="a1",
                                 release=("put_if_absent sim/lineage/",))], monkeypatch)
    assert seen["a1"] == "green took over at batch 2", seen
    assert "green's claim stands" in str(seen["a2"]), seen
    state = seen["state"]
    assert state.step == "committed" and state.decision.outcome == "claim", state


def test_green_that_lost_the_decision_to_the_call_off_writes_no_origin(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Green claimed generation gB+1 and passed its checks, then waits before its decision
    until the call-off (which read the cutover open) ended it: its decision is the call-off's, green writes no
    origin and no claimed record, and the end's retry resumes blue's lineage exactly."""
    seen = _race_call_off([Pause("a1", ("put_if_absent sim/cutover/",), until="a2", occurrence=3)],
                          monkeypatch)
    assert seen["a1"] == "refused", seen
    state = seen["state"]
    assert state.step == "aborted" and state.decision.outcome == "abort" and state.claimed is None, state
    assert seen["green_origins"] == [], seen

def test_retention_keeps_blue_s_final_savepoint_between_blue_s_stop_and_the_agreement(
        monkeypatch: pytest.MonkeyPatch, outcomes: list[Any]) -> None:
    """The orchestrator (a1) filed blue's stop_after request and is held before its
    ``agreed`` record until a3 ran: blue stops after N and takes S, a2 takes a newer
    savepoint, and a3 (``dispose --keep 1``) finds the cutover open with nothing agreed.
    S is kept because the request names its batch (no longer every savepoint of blue's
    from the warm-up on); green's claim then names it (`check_final_savepoint`)."""
    seen = _retention_beside_cutover([Pause("a2", ("",), until="a0"),
                                      Pause("a3", ("",), until="a2"),
                                      Pause("a1", ("put_if_absent sim/cutover/",), until="a3", occurrence=2)],
                                     monkeypatch)
    assert outcomes == ["green took over at batch 2"]
    assert len(seen["before"]) == 2, seen["before"]
    assert seen["disposed"] == []


def test_retention_lets_blue_s_final_savepoint_go_once_green_committed_past_n(
        monkeypatch: pytest.MonkeyPatch, outcomes: list[Any]) -> None:
    """a2 takes a newer savepoint right after green's claim; a3 runs once green committed
    its first batch past N (held before the cutover's ``done``): a rollback of green finds
    the sink ahead of S and returns to green's own checkpoint, so S is history (the job's
    commit head names green's commit); the schedule's check accepts it (the sink was past
    N when the pass started)."""
    named: list[str] = []
    real = actors.check_final_savepoint

    def check(world: Any, cid: str) -> None:
        named.append(_cutover_state(world.raw_catalog()).claimed.savepoint)
        real(world, cid)

    monkeypatch.setattr(actors, "check_final_savepoint", check)
    seen = _retention_beside_cutover([Pause("a2", ("",), until="a1", release=("claimed.json",)),
                                      Pause("a1", ("store.list sim/cutover/",), until="a2", occurrence=3),
                                      Pause("a3", ("",), until="a1", release=("fault committed",)),
                                      Pause("a1", ("put_if_absent sim/cutover/",), until="a3", occurrence=5)],
                                     monkeypatch)
    assert outcomes == ["green took over at batch 2"]
    assert len(seen["before"]) == 2, seen["before"]
    assert seen["disposed"] == named, (seen["disposed"], named)  # S, and only S
