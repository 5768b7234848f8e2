"""What waiting `SparkpointCheckpointTrigger`s cost a triggerer and a store (issue #18's
figure: 100 deferred sensors put ~130 requests per minute each on the store, and the
Python work of those calls starved the triggerer's event loop for seconds).

* a waiting trigger reads the job's status record and nothing else per poll, until the
  record moves (the running job rewrites it after every completed checkpoint);
* a hung store holds neither the event loop nor its default executor (other triggers'
  `asyncio.to_thread` calls go on);
* triggers on one store share one storage client; poll intervals are jittered.

Real catalogs under ``tmp_path`` on `LocalStorage`; the store's calls are counted, or
made to hang, at its edge (the `LocalStorage` methods).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.storage.local import LocalStorage
from tests.support.records import put_checkpoint, write_status

pytestmark = pytest.mark.airflow

JOB = "orders"
STORE_CALLS = ("get", "stat", "list", "list_dirs", "exists", "put", "put_if_absent", "delete")


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every call on a `LocalStorage`, as (method, key or prefix relative to the job)."""
    seen: list[tuple[str, str]] = []
    for name in STORE_CALLS:
        original = getattr(LocalStorage, name)

        def counted(self: LocalStorage, *args: Any, _name: str = name, _fn: Any = original,
                    **kwargs: Any) -> Any:
            first = args[0] if args and isinstance(args[0], str) else ""
            seen.append((_name, first.removeprefix(f"{JOB}/")))
            return _fn(self, *args, **kwargs)

        monkeypatch.setattr(LocalStorage, name, counted)
    yield seen


def job_status(catalog: Catalog, state: str = "running", *, completed: int = 0, last: int | None = None,
               heartbeat_at: float | None = None, generation: int = 1) -> None:
    """The status record as the runtime writes it (after every checkpoint and heartbeat)."""
    write_status(catalog, state, generation=generation, heartbeat_at=heartbeat_at, last_checkpoint_id=last,
                 checkpoints_completed=completed)


def a_running_job_with_checkpoints(catalog: Catalog, count: int) -> int:
    catalog.claim_generation()
    for _ in range(count):
        newest = put_checkpoint(catalog, generation=1).id
        job_status(catalog, completed=newest, last=newest)
    return newest


# ---------------------------------------------------------------------------- store requests


def test_a_waiting_trigger_reads_only_the_status_record_per_poll(
    catalog: Catalog, calls: list[tuple[str, str]]
) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    newest = a_running_job_with_checkpoints(catalog, 10)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=catalog.storage.uri,
                                          after_checkpoint_id=newest, poll_interval=5)
    calls.clear()
    assert trigger.poll(catalog) is None
    assert len(calls) > 10, f"the first look reads the retained checkpoints: {calls}"
    for _ in range(5):
        job_status(catalog, completed=newest, last=newest)  # a heartbeat
        calls.clear()
        assert trigger.poll(catalog) is None
        assert calls == [("get", layout.STATUS)], (
            f"a poll of a waiting trigger made {len(calls)} store requests (expected one GET of the "
            f"status record while it does not move): {calls}"
        )
    done = put_checkpoint(catalog, generation=1)
    job_status(catalog, completed=done.id, last=done.id)
    event = trigger.poll(catalog)
    assert event is not None and event["status"] == "success" and event["checkpoint_id"] == done.id


def test_a_savepoint_made_while_no_job_runs_ends_the_wait(
    catalog: Catalog, calls: list[tuple[str, str]]
) -> None:
    """No status moves when the savepoint operator copies a savepoint from the latest
    checkpoint of a stopped job: the savepoint directory listing is part of the poll."""
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    a_running_job_with_checkpoints(catalog, 2)
    job_status(catalog, "finished", completed=2, last=2, heartbeat_at=time.time() - 30)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=catalog.storage.uri, savepoint=True,
                                          after_time=time.time() - 1, poll_interval=5)
    assert trigger.poll(catalog) is None
    calls.clear()
    assert trigger.poll(catalog) is None
    assert sorted(calls) == [("get", layout.STATUS), ("list_dirs", layout.SAVEPOINTS + "/")], calls
    latest = catalog.latest()
    assert latest is not None
    handle = catalog.create_savepoint(catalog.handle(latest))
    event = trigger.poll(catalog)
    assert event is not None and event["status"] == "success" and event["savepoint_uri"] == handle.uri


def test_a_newer_run_ends_the_wait_for_a_generation_without_a_full_look(catalog: Catalog) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    a_running_job_with_checkpoints(catalog, 1)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=catalog.storage.uri, generation=1,
                                          min_checkpoints=5, poll_interval=5)
    assert trigger.poll(catalog) is None
    catalog.claim_generation()
    job_status(catalog, "starting", generation=2)
    event = trigger.poll(catalog)
    assert (event is not None and event["status"] == "error"
            and "superseded by generation 2" in event["message"])


# ---------------------------------------------------------------------------- the event loop


def test_a_hung_store_holds_neither_the_event_loop_nor_its_default_executor(
    catalog: Catalog, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More waiting triggers than the loop's default executor has threads, on a store
    whose reads hang (an S3 endpoint that stopped answering): the loop keeps running a
    canary coroutine, and another trigger's `asyncio.to_thread` call still completes."""
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    catalog.claim_generation()
    job_status(catalog, "failed")  # each trigger's first look that gets through ends its wait
    hung, blocked = threading.Event(), []
    original_get = LocalStorage.get

    def hanging_get(self: LocalStorage, key: str, max_bytes: int | None = None) -> bytes:
        blocked.append(key)
        hung.wait(60)
        return original_get(self, key, max_bytes)

    monkeypatch.setattr(LocalStorage, "get", hanging_get)
    default_threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    triggers = [SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root, poll_interval=0.05)
                for _ in range(default_threads + 4)]

    async def scenario() -> tuple[int, float, list[Any]]:
        async def first_event(trigger: Any) -> Any:
            try:
                async for event in trigger.run():
                    return event
            finally:
                await trigger.cleanup()

        waits = [asyncio.create_task(first_event(t)) for t in triggers]
        try:
            # The canary: 200 ticks of 10 ms while every poll hangs; a blocked loop never ends it.
            ticks, worst, settled = 0, 0.0, 0
            while ticks < 200:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                worst = max(worst, time.monotonic() - before - 0.01)
                ticks += 1
                settled = settled + 1 if blocked else 0
            assert blocked and settled >= 100, "no trigger reached the store"
            try:
                free = await asyncio.wait_for(asyncio.to_thread(lambda: "ran"), timeout=10)
            except asyncio.TimeoutError:
                pytest.fail(f"the loop's default executor is starved: {len(blocked)} hung store reads of "
                            f"{len(triggers)} waiting Sparkpoint triggers hold its threads, so no other "
                            "trigger's asyncio.to_thread call can run")
            assert free == "ran"
            return ticks, worst, waits
        finally:
            hung.set()

    async def main() -> tuple[int, float, list[Any]]:
        ticks, worst, waits = await scenario()
        events = await asyncio.wait_for(asyncio.gather(*waits), timeout=60)
        return ticks, worst, events

    ticks, worst, events = asyncio.run(main())
    assert ticks == 200 and worst < 5.0, f"the event loop stalled for {worst:.1f} s"
    assert [e.payload["status"] for e in events] == ["error"] * len(triggers)


# ---------------------------------------------------------------------------- sharing, jitter


def test_triggers_on_one_store_share_one_storage_client(root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    triggers = [SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root) for _ in range(3)]
    other = SparkpointCheckpointTrigger(job_name="other_job", checkpoint_dir=root)

    async def scenario() -> list[str]:
        catalogs = [await t._acatalog() for t in [*triggers, other]]
        assert len({id(c.storage) for c in catalogs}) == 1, "each trigger opened its own storage client"
        closed: list[str] = []
        catalogs[0].storage.close = lambda: closed.append("closed")  # type: ignore[method-assign]
        for trigger in [*triggers, other]:
            await trigger.cleanup()
            closed.append("released")
        return closed

    assert asyncio.run(scenario()) == ["released"] * 3 + ["closed", "released"]


def test_poll_intervals_are_jittered_and_never_pass_the_deadline() -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir="/unused", poll_interval=10)
    sleeps = [trigger._sleep_s(None) for _ in range(200)]
    assert 8.0 <= min(sleeps) and max(sleeps) <= 12.0 and max(sleeps) - min(sleeps) > 2.0, sleeps
    assert all(trigger._sleep_s(0.5) <= 0.5 for _ in range(50))


def test_the_wait_between_polls_is_one_rule_upwards_only_where_the_budget_is_a_ceiling() -> None:
    """`triggers.shared.next_wait`, used by all three triggers (issue #47): the run and
    cutover triggers' looks never come faster than `poll_interval` (their 12 requests a
    minute are a ceiling), the waiting sensor's are spread either way (±20%)."""
    from airflow_sparkpoint.triggers.shared import next_wait

    up = [next_wait(10, None, upwards_only=True) for _ in range(200)]
    assert 10.0 <= min(up) and max(up) <= 12.0 and max(up) - min(up) > 1.0, up
    both = [next_wait(10, None, upwards_only=False) for _ in range(200)]
    assert 8.0 <= min(both) < 10.0 < max(both) <= 12.0, both
    assert next_wait(10, 0.5, upwards_only=True) == 0.5 and next_wait(10, -3, upwards_only=False) == 0.0
