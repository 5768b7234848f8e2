"""The deferrable `SparkpointCutoverOperator` (issue 49) and its `SparkpointCutoverTrigger`
against a real catalog on local disk, no Spark: the test plays blue and green by writing
their records step by step (blue's status and its answer to the ``stop_after`` request
through the real control channel, green's progress, green's claim through the real
`runtime.cutover.adopt` and its first commit through the real committer), and checks at
each step what the trigger yields, what the worker writes (the agreement, the call-off:
only there), and that a resumed task starts where the records stand.

Only the triggerer's question "what state is the task instance in" is answered by the
test (the `state_of` seam), and Airflow's deferral is its `TaskDeferred`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverProgress, CutoverStore, ProgressSighting
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.services.zero_downtime import DrivePosition, plan_cutover
from tests.support.cutover_actors import blue_runs
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint, transaction_record
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow

JOB = "orders"
TASK = {"dag_id": "d", "task_id": "cutover", "run_id": "r1", "map_index": -1}


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


# ---------------------------------------------------------------------------- blue and green


def planned(catalog: Catalog, tmp_path: Path, *, reach_timeout_s: float = 600.0) -> str:
    """Blue (generation 1) runs at batch 5 with a checkpoint of it; a planned cutover."""
    catalog.claim_generation({"config": {"trigger": "processingTime:1s"}})
    put_checkpoint(catalog, batch_id=5, generation=1)
    blue_runs(catalog, 5)
    return plan_cutover(catalog, green_root=str(tmp_path / "green"), requested_by="t",
                        reach_timeout_s=reach_timeout_s).plan.id


def green_replays(catalog: Catalog, cid: str, batch: int) -> None:
    """Green's progress: it replayed blue's batches through `batch` (0.5 s each), as
    reported now (a live green rewrites its record at every poll of blue)."""
    CutoverStore(catalog).progress(CutoverProgress(cid, batch, 0.5, updated_at=time.time()))


def agreed(driver: Any, catalog: Catalog, cid: str) -> Any:
    """The worker's drive from the start to the agreement (N = 5 + 2): a first look at
    green's record (it says nothing of the record's age), green's next report, a look that
    agrees; the stop phase's position."""
    warm = driver.begin(time.time())
    warm = driver.note(warm, driver.look(warm, time.time()))
    green_replays(catalog, cid, 5)
    seen = driver.look(warm, time.time())
    assert seen.action == "agree", seen
    return driver.advance(warm, seen, time.time())


def blue_stops(catalog: Catalog, n: int, sink: FakeSink) -> None:
    """Blue takes its pending stop_after request, commits through N into `sink`, checkpoints
    N, completes the request and stops (what `runtime.run_coordination` does)."""
    for batch in range(n + 1):
        sink.world["committed"][batch] = f"orders-b{batch}-g1"
    channel = ControlChannel(catalog)
    (request,) = [r for r in channel.pending(1) if r.kind == "stop_after"]
    assert request.after_batch == n
    channel.acknowledge(request, 1)
    final = put_checkpoint(catalog, batch_id=n, generation=1)
    channel.complete(request, generation=1, batch_id=n, checkpoint=catalog.checkpoint_uri(final.id))
    blue_runs(catalog, n, state="stopped")


def green_claims(catalog: Catalog, sink: FakeSink, cid: str) -> Any:
    return adopt(catalog, sink, cid, live_dir=None)


def green_commits(catalog: Catalog, sink: FakeSink, adoption: Any) -> None:
    n = adoption.batch_id
    record = transaction_record(sink, n + 1, adoption.generation, job=JOB, created_at=0.0)
    catalog.put_transaction(record)
    committer = Committer(catalog=catalog, sink=sink, fence=Fence(catalog, adoption.generation),
                          commit_mode="checkpoint")
    committer.add_pending(record)
    committer.commit_confirmed(put_checkpoint(catalog, batch_id=n + 1, generation=adoption.generation,
                                              pending=[record]))


# ---------------------------------------------------------------------------- the trigger


def trigger(root: str, cid: str, position: DrivePosition, **kw: Any) -> Any:
    from airflow_sparkpoint.triggers.cutover import SparkpointCutoverTrigger

    return SparkpointCutoverTrigger(job_name=JOB, cutover_id=cid, position=position.to_json(),
                                    checkpoint_dir=root, task=kw.pop("task", TASK), **kw)


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """asyncio.sleep of the trigger module returns at once; the waits it asked for are kept."""
    from airflow_sparkpoint.triggers import cutover as module

    asked: list[float] = []
    real = asyncio.sleep

    async def sleep(seconds: float, *args: Any) -> None:
        asked.append(seconds)
        await real(0.001)

    monkeypatch.setattr(module.asyncio, "sleep", sleep)
    return asked


def event_after(trig: Any, sleeps: list[float], looks: int, then: Any = None) -> dict[str, Any]:
    """The trigger's one event; `then()` runs once it waited `looks` times (None: at once).
    Asserts it yields nothing before."""

    async def main() -> dict[str, Any]:
        async def first() -> dict[str, Any]:
            async for event in trig.run():
                return dict(event.payload)
            raise AssertionError("the trigger ended without an event")

        task = asyncio.ensure_future(first())
        try:
            if then is not None:
                while len(sleeps) < looks:
                    assert not task.done(), task.result()
                    await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.005)
                assert not task.done(), task.result()
                then()
            return await asyncio.wait_for(task, 30)
        finally:
            await trig.cleanup()

    return asyncio.run(main())


def test_kwargs_round_trip_and_bad_ones_are_refused(root: str) -> None:
    position = DrivePosition("stop", 1e10, 1.0, 7, "1764370000000-0123abcd", steps=("planned",),
                             progress_seen=ProgressSighting("0123456789abcdef", 3.5, True))
    assert DrivePosition.from_json(position.to_json()) == position  # green's record as last seen too
    trig = trigger(root, "1764370000000-0123abcd", position, deadline=2e10)
    path, kwargs = trig.serialize()
    assert path == "airflow_sparkpoint.triggers.cutover.SparkpointCutoverTrigger"
    assert kwargs["position"] == position.to_json() and kwargs["poll_interval"] == 10.0
    assert trigger(root, "1764370000000-0123abcd", position, **{
        k: v for k, v in kwargs.items() if k not in ("job_name", "cutover_id", "position", "checkpoint_dir")
    }).serialize() == (path, kwargs)
    with pytest.raises(ConfigError, match="poll_interval=5 is too short"):
        trigger(root, "c", position, poll_interval=5)
    with pytest.raises(ConfigError, match="position .* is invalid"):
        trigger(root, "c", DrivePosition("stop", 1.0, 1.0))  # agreed phases need N and the request
    with pytest.raises(ConfigError, match="cutover_id=''"):
        trigger(root, "", position)


def test_the_trigger_yields_at_each_step_and_only_then(catalog: Catalog, root: str, tmp_path: Path,
                                                       sleeps: list[float]) -> None:
    from airflow_sparkpoint.services.zero_downtime import CutoverDriver

    cid = planned(catalog, tmp_path)
    now = time.time()
    warm = DrivePosition("warmup", now + 600, now)
    # Warm-up: green lags (nothing replayed, then batch 1 of blue's 5: lag bound 2) -> waits.
    green_replays(catalog, cid, 1)
    driver = CutoverDriver(catalog, cid, within_s=600, requested_by="t")
    warm = driver.note(warm, driver.look(warm, time.time()))  # the worker's look before it defers
    assert warm.progress_seen is not None
    event = event_after(trigger(root, cid, warm), sleeps, 3, lambda: green_replays(catalog, cid, 3))
    assert (event["status"], event["action"], event["phase"]) == ("look", "agree", "warmup")
    assert min(sleeps) >= 10.0, sleeps  # the triggers' budget: one look per 10 s at most
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is None and ControlChannel(catalog).pending() == []  # the trigger wrote nothing

    # The worker agrees (N = 5 + 2; green's record changed since it last looked); the
    # trigger then waits for blue's stop after N.
    seen = driver.look(warm, time.time())
    stop = driver.advance(warm, seen, time.time())
    assert isinstance(stop, DrivePosition) and (stop.phase, stop.after_batch) == ("stop", 7)
    sleeps.clear()
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    event = event_after(trigger(root, cid, stop), sleeps, 3, lambda: blue_stops(catalog, 7, sink))
    assert (event["action"], event["phase"]) == ("stopped", "stop")

    claim = driver.advance(stop, driver.look(stop, time.time()), time.time())
    assert isinstance(claim, DrivePosition) and claim.phase == "claim" and claim.checkpoint
    adoption: list[Any] = []
    sleeps.clear()
    event = event_after(trigger(root, cid, claim), sleeps, 3,
                        lambda: adoption.append(green_claims(catalog, sink, cid)))
    assert (event["action"], event["phase"]) == ("claimed", "claim")

    commit = driver.advance(claim, driver.look(claim, time.time()), time.time())
    assert isinstance(commit, DrivePosition) and (commit.phase, commit.green_generation) == ("commit", 2)
    sleeps.clear()
    event = event_after(trigger(root, cid, commit), sleeps, 3,
                        lambda: green_commits(catalog, sink, adoption[0]))
    assert (event["action"], event["phase"]) == ("committed", "commit")


def test_the_trigger_respects_the_phase_bound_and_the_task_deadline(
    catalog: Catalog, root: str, tmp_path: Path, sleeps: list[float]
) -> None:
    cid = planned(catalog, tmp_path)
    now = time.time()
    event = event_after(trigger(root, cid, DrivePosition("warmup", now + 0.4, now)), sleeps, 0)
    assert (event["action"], event["phase"]) == ("call_off", "warmup")
    assert "green did not come within 2 batch(es) of blue" in event["message"]
    assert time.time() >= now + 0.4 and max(sleeps) <= 0.4 + 1e-6, sleeps  # never slept past the bound
    assert CutoverStore(catalog).read(cid).done is None  # the call-off is the worker's

    sleeps.clear()
    now = time.time()
    event = event_after(trigger(root, cid, DrivePosition("warmup", now + 600, now), deadline=now + 0.3),
                        sleeps, 0)
    assert event["status"] == "timeout" and "execution_timeout" in event["message"]
    assert max(sleeps) <= 0.3 + 1e-6, sleeps


def test_a_blue_that_dies_before_taking_the_request_is_a_call_off_with_blue_running_on(
        catalog: Catalog, root: str, tmp_path: Path, sleeps: list[float]) -> None:
    from airflow_sparkpoint.services.zero_downtime import CutoverDriver

    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 5)
    stop = agreed(CutoverDriver(catalog, cid, within_s=600, requested_by="t"), catalog, cid)
    assert isinstance(stop, DrivePosition)
    event = event_after(trigger(root, cid, stop, max_heartbeat_age=5), sleeps, 2,
                        lambda: blue_runs(catalog, 5, heartbeat_at=time.time() - 120))
    assert (event["action"], event["phase"]) == ("call_off", "stop")
    assert "was not taken: the job is not running" in event["message"]


def kill(trig: Any, state: str | None) -> None:
    async def state_of(*_args: Any) -> str | None:
        return state

    trig.state_of = state_of
    asyncio.run(trig.on_kill())


def test_on_kill_calls_the_cutover_off_unless_the_task_is_still_deferred_or_green_claimed(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    from airflow_sparkpoint.services.zero_downtime import CutoverDriver

    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 5)
    stop = agreed(CutoverDriver(catalog, cid, within_s=600, requested_by="t"), catalog, cid)
    assert isinstance(stop, DrivePosition)
    trig = trigger(root, cid, stop)
    kill(trig, "deferred")  # only moved to another triggerer: the cutover goes on
    assert CutoverStore(catalog).read(cid).done is None
    assert [r.id for r in ControlChannel(catalog).pending(1)] == [stop.request_id]
    kill(trig, "failed")  # a user marked it failed: called off, blue's request withdrawn
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.done.step) == ("aborted", "stop")  # type: ignore[union-attr]
    assert ControlChannel(catalog).pending(1) == []
    assert ControlChannel(catalog).result(str(stop.request_id)).state == "expired"


def test_on_kill_after_green_claimed_leaves_the_cutover_green_s(catalog: Catalog, root: str,
                                                                 tmp_path: Path) -> None:
    from airflow_sparkpoint.services.zero_downtime import CutoverDriver

    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 5)
    stop = agreed(CutoverDriver(catalog, cid, within_s=600, requested_by="t"), catalog, cid)
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue_stops(catalog, 7, sink)
    green_claims(catalog, sink, cid)
    assert isinstance(stop, DrivePosition)
    kill(trigger(root, cid, stop), "failed")
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.done, state.claimed.generation) == ("claimed", None, 2)  # type: ignore[union-attr]


@pytest.mark.parametrize(("native_on_kill", "state", "called_off"), [
    (False, "failed", True), (False, "deferred", False), (True, "failed", False)])
def test_before_airflow_3_3_cleanup_of_a_cancelled_trigger_calls_off_as_on_kill_does(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeps: list[float],
        native_on_kill: bool, state: str, called_off: bool) -> None:
    """Airflow 3.2 has no `BaseTrigger.on_kill`: a user's stop only cancels the trigger,
    then calls `cleanup`, which asks the task's state and calls off as `on_kill` does; a
    triggerer restart (the task still deferred) leaves the cutover be; on 3.3 the
    triggerer calls `on_kill` itself and `cleanup` does nothing more."""
    from airflow_sparkpoint.triggers import run as module  # the stoppable triggers' cleanup reads it there

    monkeypatch.setattr(module, "NATIVE_ON_KILL", native_on_kill)
    cid = planned(catalog, tmp_path)
    now = time.time()
    trig = trigger(root, cid, DrivePosition("warmup", now + 600, now))
    asked: list[tuple[Any, ...]] = []

    async def state_of(*args: Any) -> str:
        asked.append(args)
        return state

    trig.state_of = state_of

    async def cancelled_after_a_look() -> None:
        async def consume() -> None:
            async for _event in trig.run():
                raise AssertionError("no event expected")

        task = asyncio.ensure_future(consume())
        while not sleeps:
            await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await trig.cleanup()

    asyncio.run(cancelled_after_a_look())
    assert asked == ([] if native_on_kill else [("d", "cutover", "r1", -1)])
    done = CutoverStore(catalog).read(cid).done
    assert (done is not None and (done.outcome, done.step) == ("aborted", "warmup")) == called_off, done


# ---------------------------------------------------------------------------- the operator


def operator(root: str, cid: str, **kw: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointCutoverOperator

    return SparkpointCutoverOperator(task_id="cutover", job_name=JOB, checkpoint_dir=root, cutover_id=cid,
                                     deferrable=kw.pop("deferrable", True), **kw)


def deferred(call: Any) -> Any:
    """The `TaskDeferred` `call()` raised: (its trigger's kwargs, the resume kwargs)."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_sparkpoint.triggers.cutover import SparkpointCutoverTrigger

    with pytest.raises(TaskDeferred) as raised:
        call()
    assert isinstance(raised.value.trigger, SparkpointCutoverTrigger)
    assert raised.value.method_name == "execute_complete"
    return raised.value.trigger.serialize()[1], raised.value.kwargs


def agree_deferred(op: Any, context: dict[str, Any], catalog: Catalog, cid: str) -> Any:
    """`op`'s execute, deferred in the warm-up (its first look at green's record says
    nothing of the record's age), green's next report, the resumed worker's agreement
    (N = 5 + 2): `deferred` of the stop phase."""
    trig, resume = deferred(lambda: op.execute(context))
    assert trig["position"]["phase"] == "warmup", trig["position"]
    green_replays(catalog, cid, 5)
    event = {"status": "look", "cutover_id": cid, "phase": "warmup", "action": "agree", "message": ""}
    return deferred(lambda: op.execute_complete(context, event, **resume))


def test_execute_defers_and_each_resume_acts_in_the_worker_to_green_s_first_commit(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 1)  # behind: the first look only notes green's record
    op = operator(root, cid, execution_timeout=__import__("datetime").timedelta(hours=1))
    context = {"ti": FakeTI(**TASK)}
    trig, resume = deferred(lambda: op.execute(context))
    assert trig["position"]["phase"] == "warmup" and trig["task"]["task_id"] == "cutover"
    assert (time.time() + 3500 < trig["deadline"] <= time.time() + 3600
            and resume["deadline"] == trig["deadline"])
    assert trig["poll_interval"] == 10.0  # the operator's 2 s, raised to the triggers' floor
    assert CutoverStore(catalog).read(cid).agreed is None

    green_replays(catalog, cid, 4)  # the trigger would fire now; the worker looks again and agrees
    event = {"status": "look", "cutover_id": cid, "phase": "warmup", "action": "agree", "message": ""}
    trig, resume = deferred(lambda: op.execute_complete(context, event, **resume))
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is not None and state.agreed.after_batch == 7
    assert [r.id for r in ControlChannel(catalog).pending(1)] == [state.agreed.request_id]
    assert trig["position"]["phase"] == "stop" and trig["position"]["request_id"] == state.agreed.request_id

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue_stops(catalog, 7, sink)
    event = {**event, "phase": "stop", "action": "stopped"}
    trig, resume = deferred(lambda: op.execute_complete(context, event, **resume))
    assert trig["position"]["phase"] == "claim"

    adoption = green_claims(catalog, sink, cid)
    green_commits(catalog, sink, adoption)  # both before the worker looks: it moves through both
    outcome = op.execute_complete(context, {**event, "phase": "claim", "action": "claimed"}, **resume)
    assert (outcome["step"], outcome["after_batch"], outcome["green_generation"]) == ("committed", 7, 2)
    assert outcome["blue_checkpoint"] and outcome["cutover_id"] == cid
    kinds = [s.split(":")[0].split(" (")[0] for s in outcome["steps"]]
    assert [k for k in kinds if k != "warm-up"] == [
        "planned", "agreed", "blue", "green claimed the job as generation 2 at batch 7",
        "green committed its first batch into the job's sinks"], outcome["steps"]
    # Every batch once: through N by blue, N+1 by green (the oracle: batch ids and owners).
    assert sorted(sink.world["committed"]) == list(range(9))
    assert [sink.world["committed"][b] for b in range(8)] == [f"orders-b{b}-g1" for b in range(8)]


def test_a_retried_task_resumes_where_the_records_stand_without_a_second_agreement(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 5)
    context = {"ti": FakeTI(**TASK)}
    trig, _ = agree_deferred(operator(root, cid), context, catalog, cid)  # agreed, then deferred
    agreed = CutoverStore(catalog).read(cid).agreed
    assert agreed is not None and trig["position"]["phase"] == "stop"
    # The worker was lost: a new try's execute finds the agreement in the records.
    trig, _ = deferred(lambda: operator(root, cid).execute(context))
    assert (trig["position"]["phase"], trig["position"]["request_id"]) == ("stop", agreed.request_id)
    assert CutoverStore(catalog).read(cid).agreed == agreed
    assert [r.id for r in ControlChannel(catalog).pending(1)] == [agreed.request_id]  # one request only


def test_a_timeout_while_deferred_calls_off_before_the_claim_and_not_after(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowTaskTimeout

    cid = planned(catalog, tmp_path)
    green_replays(catalog, cid, 5)
    context = {"ti": FakeTI(**TASK)}
    op = operator(root, cid)
    _, resume = agree_deferred(op, context, catalog, cid)
    timeout = {"status": "timeout", "cutover_id": cid, "phase": "stop", "message": "past execution_timeout"}
    with pytest.raises(AirflowTaskTimeout, match="past execution_timeout"):
        op.execute_complete(context, timeout, **resume)
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.done.step) == ("aborted", "stop")  # type: ignore[union-attr]
    assert ControlChannel(catalog).pending(1) == []

    other = planned_again(catalog, tmp_path)
    op = operator(root, other)
    _, resume = agree_deferred(op, context, catalog, other)
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue_stops_generation(catalog, sink)
    green_claims(catalog, sink, other)
    with pytest.raises(AirflowTaskTimeout):
        op.execute_complete(context, {**timeout, "cutover_id": other}, **resume)
    state = CutoverStore(catalog).read(other)
    assert (state.step, state.done) == ("claimed", None)  # green's: not called off


def planned_again(catalog: Catalog, tmp_path: Path) -> str:
    """A second cutover of the same blue (the first was called off before blue stopped)."""
    cid = plan_cutover(catalog, green_root=str(tmp_path / "green"), requested_by="t").plan.id
    green_replays(catalog, cid, 5)
    return cid


def blue_stops_generation(catalog: Catalog, sink: FakeSink) -> None:
    (request,) = [r for r in ControlChannel(catalog).pending(1) if r.kind == "stop_after"]
    blue_stops(catalog, int(request.after_batch or 0), sink)


def test_a_malformed_event_is_refused_and_deferrable_defaults_to_the_airflow_setting(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    cid = planned(catalog, tmp_path)
    op = operator(root, cid)
    with pytest.raises(AirflowException, match="is not this cutover's"):
        op.execute_complete({"ti": FakeTI(**TASK)}, {"status": "look", "cutover_id": "other"}, position={},
                            deadline=None)
    assert CutoverStore(catalog).read(cid).step == "planned"
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    assert operator(root, cid, deferrable=None).deferrable is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "false")
    assert operator(root, cid, deferrable=None).deferrable is False


def test_a_task_resumed_after_green_s_claim_does_not_call_off_even_past_every_bound(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    """A worker lost after green claimed, the task back only after every reach bound
    passed: it walks the records (blue stopped, green claimed), waits for green's first
    commit a bound of its own (bounds run on the orchestrator's clock from when it sees a
    step) and ends ``claimed``; the cutover is green's, never called off."""
    cid = planned(catalog, tmp_path, reach_timeout_s=0.5)
    green_replays(catalog, cid, 5)
    context = {"ti": FakeTI(**TASK)}
    trig, _ = agree_deferred(operator(root, cid), context, catalog, cid)
    assert trig["position"]["phase"] == "stop"
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue_stops(catalog, 7, sink)
    green_claims(catalog, sink, cid)
    time.sleep(0.6)  # every bound (0.5 s from the agreement, blue's stop, green's claim) passed
    op = operator(root, cid)
    trig, resume = deferred(lambda: op.execute(context))  # the retry: waits for green's first commit
    assert trig["position"]["phase"] == "commit", trig["position"]
    time.sleep(0.6)  # its bound passed too
    event = {"status": "look", "cutover_id": cid, "phase": "commit", "action": "uncommitted",
             "message": "bound"}
    outcome = op.execute_complete(context, event, **resume)
    assert (outcome["step"], outcome["after_batch"], outcome["green_generation"]) == ("claimed", 7, 2)
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.done) == ("claimed", None)
    assert any(s.startswith("resumed: agreed already") for s in outcome["steps"]), outcome["steps"]
