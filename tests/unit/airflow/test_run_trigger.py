"""`SparkpointRunTrigger` (the deferrable submit's trigger, issue #50) against a real local
catalog, in an asyncio loop: the run's status transitions become its one event, a silent
driver is declared dead only after the stated bound, its store requests stay within 12 a
minute (counted by `CountingStorage` around a real `LocalStorage`), and `on_kill` leaves a
still-deferred task's run alone but otherwise writes the cancel and kills the recorded
process group (a real one, started through the real detached launcher).

Only the triggerer's question "what state is the task instance in" is answered by the
test (the `state_of` seam): no triggerer runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.detached import DriverProcess, group_exists, launch
from airflow_sparkpoint.services.follow import RunFollower
from airflow_sparkpoint.storage.counting import CountingStorage
from airflow_sparkpoint.storage.local import LocalStorage
from tests.support.records import write_status

pytestmark = pytest.mark.airflow

JOB = "orders"
TASK = {"dag_id": "d", "task_id": "job", "run_id": "r1", "map_index": -1}


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def trigger(root: str, **kw: Any) -> Any:
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    return SparkpointRunTrigger(job_name=JOB, generation=kw.pop("generation", 1), checkpoint_dir=root,
                                task=kw.pop("task", TASK), **kw)


async def first_event(trig: Any, sleeps: list[float] | None = None) -> dict[str, Any]:
    async for event in trig.run():
        await trig.cleanup()
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


@pytest.fixture()
def fast_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """asyncio.sleep of the trigger module returns at once; the waits it asked for are kept."""
    from airflow_sparkpoint.triggers import run as run_module

    asked: list[float] = []
    real = asyncio.sleep

    async def sleep(seconds: float, *args: Any) -> None:
        asked.append(seconds)
        await real(0)

    monkeypatch.setattr(run_module.asyncio, "sleep", sleep)
    return asked


async def pause() -> None:
    """The test's own short wait (asyncio.sleep is the trigger's, patched by `fast_sleep`)."""
    await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.01)


def test_kwargs_round_trip_and_bad_ones_are_refused(root: str) -> None:
    process = {"host": "h", "boot_id": "b", "pgid": 1234, "leader_start": "99", "log": "/tmp/x.log"}
    trig = trigger(root, process=process, deadline=123.0)
    path, kwargs = trig.serialize()
    assert path == "airflow_sparkpoint.triggers.run.SparkpointRunTrigger"
    assert trigger(root, **{k: v for k, v in kwargs.items() if k not in ("job_name", "checkpoint_dir")}
                   ).serialize() == (path, kwargs)
    with pytest.raises(ConfigError, match="poll_interval=5 is too short"):
        trigger(root, poll_interval=5)
    with pytest.raises(ConfigError, match="generation=0"):
        trigger(root, generation=0)
    with pytest.raises(ConfigError, match="pgid=1"):
        trigger(root, process={**process, "pgid": 1})
    with pytest.raises(ConfigError, match="task="):
        trigger(root, task={"dag_id": 3})


@pytest.mark.parametrize(("state", "error", "expected"), [
    ("finished", None, "success"), ("stopped", None, "success"), ("failed", "ValueError: boom", "failed"),
])
def test_the_runs_final_status_is_the_event(catalog: Catalog, root: str, fast_sleep: list[float], state: str,
                                            error: str | None, expected: str) -> None:
    catalog.claim_generation()
    write_status(catalog, state, error=error)
    event = asyncio.run(first_event(trigger(root)))
    assert event["status"] == expected and event["generation"] == 1 and event["state"] == state, event
    if error:
        assert event["message"] == error


def test_running_then_ending_is_followed_until_the_end(catalog: Catalog, root: str,
                                                       fast_sleep: list[float]) -> None:
    catalog.claim_generation()
    write_status(catalog, "running")
    trig = trigger(root)

    async def scenario() -> dict[str, Any]:
        events = trig.run()
        task = asyncio.ensure_future(events.__anext__())
        while len(fast_sleep) < 3:  # three looks saw it running
            await pause()
        assert not task.done()
        write_status(catalog, "finished")
        event = await asyncio.wait_for(task, 10)
        await trig.cleanup()
        return dict(event.payload)

    event = asyncio.run(scenario())
    assert event["status"] == "success" and event["state"] == "finished", event


def test_a_superseded_generation_fails_naming_the_newer_one(catalog: Catalog, root: str,
                                                            fast_sleep: list[float]) -> None:
    catalog.claim_generation()
    write_status(catalog, "running")
    catalog.claim_generation()
    event = asyncio.run(first_event(trigger(root)))
    assert event["status"] == "failed" and "superseded: generation 2 was claimed" in event["message"], event


def test_a_silent_driver_is_dead_only_after_the_bound_on_two_looks(catalog: Catalog) -> None:
    catalog.claim_generation()
    t0 = 1_000_000.0
    write_status(catalog, "running", heartbeat_at=t0)
    follower = RunFollower(catalog, 1, dead_after=60.0)
    assert follower.look(now=t0 + 30) is None  # fresh
    assert follower.look(now=t0 + 61) is None  # stale once: not yet
    assert follower.look(now=t0 + 70) is not None  # stale twice, past the bound
    again = RunFollower(catalog, 1, dead_after=60.0)
    assert again.look(now=t0 + 61) is None
    event = again.look(now=t0 + 71)
    assert event is not None and event["status"] == "dead", event
    assert "generation 1" in event["message"] and "silent for more than 60 s" in event["message"], event
    # a heartbeat in between resets it
    third = RunFollower(catalog, 1, dead_after=60.0)
    assert third.look(now=t0 + 61) is None
    write_status(catalog, "running", heartbeat_at=t0 + 65)
    assert third.look(now=t0 + 70) is None
    assert third.look(now=t0 + 80) is None


def test_a_run_that_never_wrote_a_status_is_dead_after_the_bound(catalog: Catalog) -> None:
    catalog.claim_generation()
    follower = RunFollower(catalog, 1, dead_after=60.0)
    assert follower.look(now=100.0) is None
    assert follower.look(now=150.0) is None
    event = follower.look(now=161.0)
    assert event is not None and event["status"] == "dead" and "never wrote a status" in event["message"]


def test_the_trigger_makes_at_most_12_store_requests_a_minute(catalog: Catalog, root: str,
                                                              fast_sleep: list[float]) -> None:
    catalog.claim_generation()
    write_status(catalog, "running")
    counting = CountingStorage(LocalStorage(root))
    trig = trigger(root)
    trig._catalog = Catalog(counting, JOB)  # the trigger's own code, on a counted store

    async def scenario() -> None:
        events = trig.run()
        task = asyncio.ensure_future(events.__anext__())
        while len(fast_sleep) < 30:
            write_status(catalog, "running")  # the driver's heartbeat
            await pause()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    looks = len(fast_sleep)
    minutes = sum(fast_sleep) / 60.0
    assert min(fast_sleep) >= 10.0, fast_sleep
    rate = counting.total / minutes
    assert counting.total >= 2 * looks - 2, (counting.total, looks)  # it did look, two requests each
    assert rate <= 12.0, f"{counting.total} requests in {minutes:.1f} min = {rate:.1f}/min"
    print(f"trigger store requests: {counting.total} in {minutes:.2f} simulated min = {rate:.2f}/min "
          f"({dict(counting.calls)})")


def a_detached_group(tmp_path: Path) -> DriverProcess:
    """A real process group through the real detached launcher (its command sleeps)."""
    return launch(["sleep", "600"], dict(os.environ), log_path=str(tmp_path / "driver.log"), keep_fd=None)


def answer_cancels(catalog: Catalog, stop: threading.Event) -> threading.Thread:
    """What the driver does with a cancel request of its generation: take it, record its end."""
    def serve() -> None:
        channel = ControlChannel(catalog)
        while not stop.wait(0.2):
            for request in channel.pending(1):
                if request.kind == "cancel":
                    channel.acknowledge(request, 1)
                    write_status(catalog, "stopped", generation=1)
                    channel.complete(request, generation=1)
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def a_running_job(catalog: Catalog, tmp_path: Path) -> Iterator[DriverProcess]:
    """Generation 1 claimed and running, its driver a detached group (`a_detached_group`),
    killed at the end whatever happened."""
    catalog.claim_generation()
    write_status(catalog, "running")
    process = a_detached_group(tmp_path)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pgid, 9)


@contextlib.contextmanager
def a_driver_answering_cancels(catalog: Catalog, tmp_path: Path) -> Iterator[DriverProcess]:
    """A detached process group (`a_detached_group`) whose run takes a cancel request
    (`answer_cancels`); stopped, and its group killed, at the end whatever happened."""
    process = a_detached_group(tmp_path)
    stop = threading.Event()
    driver = answer_cancels(catalog, stop)
    try:
        yield process
    finally:
        stop.set()
        driver.join(5)
        if group_exists(process.pgid):
            os.killpg(process.pgid, 9)


def requests_of(catalog: Catalog) -> list[tuple[str, int | None]]:
    """(kind, generation) of every control request of the job."""
    channel = ControlChannel(catalog)
    return [(r.kind, r.generation) for r in (channel.read_request(i) for i in channel.request_ids())]


def test_on_kill_while_still_deferred_writes_nothing_and_kills_nothing(catalog: Catalog, root: str,
                                                                       tmp_path: Path) -> None:
    with a_running_job(catalog, tmp_path) as process:
        trig = trigger(root, process=process.to_json())
        asked: list[tuple[Any, ...]] = []

        async def deferred(*args: Any) -> str:
            asked.append(args)
            return "deferred"

        trig.state_of = deferred
        asyncio.run(trig.on_kill())
        assert asked == [("d", "job", "r1", -1)], "on_kill did not ask the task's state"
        assert ControlChannel(catalog).request_ids() == []
        assert process.running() and group_exists(process.pgid)


@pytest.mark.parametrize("state", ["failed", "success", None])
def test_on_kill_of_a_stopped_task_cancels_the_run_and_kills_its_group(catalog: Catalog, root: str,
                                                                       tmp_path: Path,
                                                                       state: str | None) -> None:
    catalog.claim_generation()
    write_status(catalog, "running")
    with a_driver_answering_cancels(catalog, tmp_path) as process:
        assert process.here() and process.running() and process.pgid != os.getpgid(0)
        trig = trigger(root, process=process.to_json())

        async def stopped(*_args: Any) -> str | None:
            return state

        trig.state_of = stopped
        t0 = time.monotonic()
        asyncio.run(trig.on_kill())
        took = time.monotonic() - t0
        assert requests_of(catalog) == [("cancel", 1)]
        assert not group_exists(process.pgid), "the driver's process group outlived on_kill"
        assert took < 30, took
        print(f"on_kill ({state}): run cancelled and its process group gone in {took:.1f} s")


def test_on_kill_leaves_the_run_alone_when_the_tasks_state_cannot_be_read(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.triggers import run as run_module

    monkeypatch.setattr(run_module, "STATE_TIMEOUT_S", 0.5)
    with a_running_job(catalog, tmp_path) as process:
        trig = trigger(root, process=process.to_json())
        asked: list[str] = []

        async def hangs(*_args: Any) -> str:
            asked.append("asked")
            await asyncio.sleep(60)
            return "failed"

        async def fails(*_args: Any) -> str:
            asked.append("asked")
            raise RuntimeError("the API server is unreachable")

        for answer in (hangs, fails):
            trig.state_of = answer
            t0 = time.monotonic()
            asyncio.run(trig.on_kill())
            assert time.monotonic() - t0 < 5
        assert asked == ["asked", "asked"]
        assert ControlChannel(catalog).request_ids() == [] and process.running()


def test_on_kill_finishes_the_stop_when_the_triggerer_cancels_it_again_and_cleans_up(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    """Airflow 3.3's triggerer sends a trigger's cancellation again at every state sync
    (about once a second) until the trigger has finished, each time with the user-action
    message, and swallows a cancelled `on_kill` before calling `cleanup`: seen on the e2e
    stack, where the task's state took 14 s to come and the stop never ran. The stop must
    survive that."""
    catalog.claim_generation()
    write_status(catalog, "running")
    with a_driver_answering_cancels(catalog, tmp_path) as process:
        trig = trigger(root, process=process.to_json())

        async def slow_failed(*_args: Any) -> str:
            await asyncio.sleep(1.5)
            return "failed"

        trig.state_of = slow_failed

        async def triggerer() -> None:
            await trig._acatalog()  # the trigger ran: its catalog is open
            killing = asyncio.ensure_future(trig.on_kill())
            for _ in range(4):  # the re-sent cancellations
                await asyncio.sleep(0.5)
                killing.cancel("__airflow_user_action__")
            with contextlib.suppress(asyncio.CancelledError):
                await killing
            await trig.cleanup()  # what the triggerer does next
            deadline = time.monotonic() + 25
            while group_exists(process.pgid) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)

        asyncio.run(triggerer())
        assert requests_of(catalog) == [("cancel", 1)]
        assert not group_exists(process.pgid), "the stop did not survive the triggerer's cancellations"


def test_the_trigger_owns_execution_timeout_it_stops_the_run_at_the_deadline(
        catalog: Catalog, root: str, tmp_path: Path, fast_sleep: list[float]) -> None:
    """Airflow does not apply execution_timeout while a task is deferred: at the deadline
    the trigger cancels the run, kills its group and reports ``timeout``."""
    catalog.claim_generation()
    write_status(catalog, "running")
    with a_driver_answering_cancels(catalog, tmp_path) as process:
        event = asyncio.run(first_event(trigger(root, process=process.to_json(), deadline=time.time() - 1)))
        assert event["status"] == "timeout" and "execution_timeout" in event["message"], event
        assert requests_of(catalog) == [("cancel", 1)]
        assert not group_exists(process.pgid)


async def cancelled_after_a_look(trig: Any) -> None:
    """What the triggerer does when it drops a trigger that has not fired: cancel its
    task (a user's stop and a triggerer's shutdown alike), then call `cleanup`."""
    async def follow() -> None:
        async for _event in trig.run():
            raise AssertionError("the trigger fired; the case needs a running job")

    following = asyncio.ensure_future(follow())
    await asyncio.sleep(0.5)  # its first look is done; it waits for the next one
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    await trig.cleanup()


@pytest.mark.parametrize("state", ["failed", "success", None])
def test_before_airflow_3_3_cleanup_of_a_cancelled_trigger_stops_the_run_of_a_stopped_task(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        state: str | None) -> None:
    """Airflow 3.2 has no `BaseTrigger.on_kill`: a mark-failed, mark-success or clear of a
    deferred task only cancels its trigger, then calls `cleanup`; there the trigger asks
    the task's state and stops the run as `on_kill` does on 3.3."""
    from airflow_sparkpoint.triggers import run as run_module

    monkeypatch.setattr(run_module, "NATIVE_ON_KILL", False)
    catalog.claim_generation()
    write_status(catalog, "running")
    with a_driver_answering_cancels(catalog, tmp_path) as process:
        trig = trigger(root, process=process.to_json())
        asked: list[tuple[Any, ...]] = []

        async def stopped(*args: Any) -> str | None:
            asked.append(args)
            return state

        trig.state_of = stopped
        asyncio.run(cancelled_after_a_look(trig))
        assert asked == [("d", "job", "r1", -1)], "cleanup did not ask the task's state"
        assert requests_of(catalog) == [("cancel", 1)]
        assert not group_exists(process.pgid), "the driver's process group outlived cleanup"


def test_before_airflow_3_3_cleanup_leaves_the_run_of_a_still_deferred_task_alone(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A triggerer's shutdown or restart cancels the trigger too: the task instance is
    still deferred, and the job goes on."""
    from airflow_sparkpoint.triggers import run as run_module

    monkeypatch.setattr(run_module, "NATIVE_ON_KILL", False)
    with a_running_job(catalog, tmp_path) as process:
        trig = trigger(root, process=process.to_json())
        asked: list[str] = []

        async def deferred(*_args: Any) -> str:
            asked.append("asked")
            return "deferred"

        trig.state_of = deferred
        asyncio.run(cancelled_after_a_look(trig))
        assert asked == ["asked"], "cleanup did not ask the task's state"
        assert ControlChannel(catalog).request_ids() == [] and process.running()


@pytest.mark.parametrize("native_on_kill", [True, False])
def test_cleanup_after_the_event_or_with_native_on_kill_never_stops_the_run(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        native_on_kill: bool) -> None:
    """`cleanup` after the trigger fired (any Airflow), and `cleanup` of a cancelled trigger
    where the triggerer calls `on_kill` itself (3.3+), ask nothing and stop nothing."""
    from airflow_sparkpoint.triggers import run as run_module

    monkeypatch.setattr(run_module, "NATIVE_ON_KILL", native_on_kill)
    with a_running_job(catalog, tmp_path) as process:
        asked: list[str] = []

        async def failed(*_args: Any) -> str:
            asked.append("asked")
            return "failed"

        if native_on_kill:
            trig = trigger(root, process=process.to_json())
            trig.state_of = failed
            asyncio.run(cancelled_after_a_look(trig))
        else:
            write_status(catalog, "finished")
            trig = trigger(root, process=process.to_json())
            trig.state_of = failed
            assert asyncio.run(first_event(trig))["status"] == "success"  # first_event calls cleanup
        assert asked == [] and ControlChannel(catalog).request_ids() == [] and process.running()
