"""A clear of a deferred submit task (issue #50): the new try restarts the job, as a
non-deferred task's clear does, whichever comes first: its re-attach to the running
generation or the old try's trigger's ``cancel`` (`SparkpointRunTrigger.on_kill`).

A real local catalog; the old try's trigger runs its real `on_kill` (only the task's state
is answered, the `state_of` seam); the driver that serves the cancel is a thread writing
what the runtime writes; spark-submit is a stand-in script (the process edge), started by
the real detached launcher, that claims its generation as a driver does and records what
it saw of the earlier run when it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.services.retry import TaskRecord
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_submit import FakeStore
from tests.support.records import live_submit_run, write_status
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow

JOB = "orders"
RUN_ID = "manual__7"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def operator(root: Path) -> Any:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB,
                                    checkpoint_dir=str(root), deferrable=True)


def first_try_run(catalog: Catalog, store: FakeStore, dag_id: str) -> int:
    """Try 1 launched its driver, which claimed generation 1 and runs; try 1 deferred on it."""
    generation = live_submit_run(catalog, dag_id, token="tok1", run_id=RUN_ID)
    TaskRecord(1, "latest", ("tok1",), 0).save(store)
    store.set("sparkpoint_detached", {"generation": generation, "token": "tok1", "since": 0, "process": {
        "host": "worker-9", "boot_id": "b", "pgid": 777, "leader_start": "5", "log": "/x/driver.log"},
        "deadline": None})
    return generation


def deferred_first_try(tmp_path: Path) -> tuple[Path, Catalog, FakeStore, Any, Any]:
    """Try 1 of the task launched its run and deferred: the root, the catalog, the task's
    state store, the operator and the `TaskDeferred` it raised (its trigger's arguments)."""
    from airflow.sdk.exceptions import TaskDeferred

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    store = FakeStore()
    op = operator(root)
    first_try_run(catalog, store, op.dag_id)
    with pytest.raises(TaskDeferred) as old:
        op.execute({"ti": FakeTI(try_number=1), "run_id": RUN_ID, "task_state_store": store})
    return root, catalog, store, op, old


@contextlib.contextmanager
def a_stand_in_spark_submit(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """spark-submit on PATH: claims a generation with its submit token, writes it runs, and
    records the state generation 1 was in when it started (``seen.json``); its process
    groups are killed at the end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen.json"
    script = bin_dir / "spark-submit"
    script.write_text(f"""#!{sys.executable}
import json, os, time
from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history_records import generation_details
from airflow_sparkpoint.checkpoints.status import JobStatus, read_job_status
from airflow_sparkpoint.storage import open_storage
catalog = Catalog(open_storage({str(root)!r}), {JOB!r})
earlier = read_job_status(catalog, 1)
with open({str(seen)!r}, "w") as f:
    json.dump({{"state": earlier.state if earlier else None, "pgid": os.getpgid(0)}}, f)
claim = catalog.claim_generation({{**generation_details(environ=os.environ),
                                   "submitter": os.environ["SPARKPOINT_SUBMITTER"]}})
now = time.time()
catalog.write_status(JobStatus({JOB!r}, claim.generation, "running", now, now).to_json())
time.sleep(600)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "nospark"))
    try:
        yield seen
    finally:
        if seen.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(json.loads(seen.read_text())["pgid"], 9)


def serve_cancel(catalog: Catalog, *, after_s: float = 0.0) -> threading.Thread:
    """Generation 1's driver: takes the cancel request addressed to it at once, and
    `after_s` seconds later (a batch to finish) records the run stopped (status, result)
    and completes the request."""
    def serve() -> None:
        channel = ControlChannel(catalog)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for request in channel.pending(1):
                if request.kind == "cancel":
                    channel.acknowledge(request, 1)
                    time.sleep(after_s)
                    write_status(catalog, "stopped", generation=1, host="worker-9", pid=4242)
                    write_run_result(catalog, RunResult(status="stopped", job=JOB, generation=1,
                                                        batches_processed=3))
                    channel.complete(request, generation=1)
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def old_trigger_kills(root: Path, kwargs: dict[str, Any], state: str = "queued") -> None:
    """The old try's trigger (its serialized kwargs) is cancelled by the clear: its real
    `on_kill`, the task instance's state answered `state`."""
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    trig = SparkpointRunTrigger(**{**kwargs, "process": None})

    async def state_of(*_args: Any) -> str:
        return state

    trig.state_of = state_of
    asyncio.run(trig.on_kill())


def trigger_kwargs_of(deferred: Any) -> dict[str, Any]:
    return dict(deferred.value.trigger.serialize()[1])


def test_a_new_try_that_re_attached_before_the_old_triggers_cancel_starts_a_new_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordering 1: the cleared task's new try re-attaches to generation 1 first; the old
    try's trigger's cancel then ends the run. The new try must not succeed ``stopped``:
    it starts the job again (a new generation, restore latest) and defers on it. Airflow
    3.2: no task state store, so the new try cannot know that try 1 had deferred (with
    one, it stops the run itself: ordering 3)."""
    from airflow.sdk.exceptions import TaskDeferred

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    op = operator(root)
    first_try_run(catalog, FakeStore(), op.dag_id)
    # the old try's trigger, as try 1 deferred it (its task names try 1)
    with pytest.raises(TaskDeferred) as old:
        op.execute({"ti": FakeTI(try_number=1), "run_id": RUN_ID})
    old_kwargs = trigger_kwargs_of(old)
    assert old_kwargs["generation"] == 1
    # the clear: try 2 starts before the old trigger's on_kill wrote its cancel, re-attaches
    ti = FakeTI(try_number=2)
    context: Any = {"ti": ti, "run_id": RUN_ID}
    with pytest.raises(TaskDeferred) as new:
        op.execute(context)
    assert trigger_kwargs_of(new)["generation"] == 1 and catalog.current_generation() == 1
    driver = serve_cancel(catalog)
    old_trigger_kills(root, old_kwargs)
    driver.join(10)
    assert read_job_status(catalog, 1).state == "stopped"
    cancels = [ControlChannel(catalog).read_request(i) for i in ControlChannel(catalog).request_ids()]
    assert [(r.kind, r.generation) for r in cancels] == [("cancel", 1)]
    assert "try 1" in cancels[0].requested_by and f"{op.dag_id}.submit" in cancels[0].requested_by, \
        cancels[0].requested_by
    # the new try's trigger reports the end: a stop the old try's trigger wrote
    event = {"status": "success", "state": "stopped", "generation": 1, "job": JOB, "message": "",
             "dead_after": 60.0}
    with a_stand_in_spark_submit(tmp_path, root, monkeypatch) as seen:
        with pytest.raises(TaskDeferred) as again:
            op.execute_complete(context, event, **new.value.kwargs)
        kwargs = trigger_kwargs_of(again)
        assert kwargs["generation"] == 2, "the new try did not start a new generation"
        assert again.value.kwargs["generation"] == 2 and catalog.current_generation() == 2
        assert json.loads(seen.read_text())["state"] == "stopped"
        assert ti.pushed["generation"] == 2
        assert catalog.generation_claim(2).submitter == again.value.kwargs["token"]


def test_a_new_try_that_looks_after_the_old_triggers_cancel_waits_for_the_run_to_end_then_starts_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordering 2: the old try's trigger wrote its cancel first and the dying run takes a
    while to end. The new try neither re-attaches to it nor fails, nor starts while it
    runs (never two live runs): it waits for its end, then starts generation 2."""
    from airflow.sdk.exceptions import TaskDeferred

    root, catalog, store, op, old = deferred_first_try(tmp_path)
    driver = serve_cancel(catalog, after_s=5.0)  # the driver takes a while to stop
    killing = threading.Thread(target=old_trigger_kills, args=(root, trigger_kwargs_of(old)), daemon=True)
    killing.start()
    deadline = time.monotonic() + 10
    while not ControlChannel(catalog).request_ids():
        assert time.monotonic() < deadline, "the old trigger wrote no cancel"
        time.sleep(0.05)
    ti = FakeTI(try_number=2)
    context: Any = {"ti": ti, "run_id": RUN_ID, "task_state_store": store}
    with a_stand_in_spark_submit(tmp_path, root, monkeypatch) as seen:
        with pytest.raises(TaskDeferred) as new:
            op.execute(context)
        assert trigger_kwargs_of(new)["generation"] == 2 and catalog.current_generation() == 2
        assert json.loads(seen.read_text())["state"] == "stopped", \
            "the new generation started while the old run still ran"
    driver.join(10)
    killing.join(30)


@pytest.mark.parametrize("by", ["this try's trigger", "a savepoint with stop"])
def test_a_stop_asked_of_this_try_keeps_its_outcome(tmp_path: Path, by: str) -> None:
    """A stop of the run the new try follows that the user asked of *this* try (its own
    trigger's cancel: mark-failed; a stop-with-savepoint) ends the task ``stopped``."""
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    store = FakeStore()
    op = operator(root)
    first_try_run(catalog, store, op.dag_id)
    channel = ControlChannel(catalog)
    if by == "a savepoint with stop":
        request = channel.submit("stop", generation=1, requested_by="SparkpointSavepointOperator 'stop'")
    else:
        task = {"dag_id": op.dag_id, "task_id": "submit", "run_id": RUN_ID, "map_index": -1, "try_number": 2}
        trig = SparkpointRunTrigger(job_name=JOB, generation=1, checkpoint_dir=str(root), task=task)
        request = channel.submit("cancel", generation=1, requested_by=trig.user_stop_by())
    channel.acknowledge(request, 1)
    write_status(catalog, "stopped", generation=1, host="worker-9", pid=4242)
    write_run_result(catalog, RunResult(status="stopped", job=JOB, generation=1, batches_processed=3))
    channel.complete(request, generation=1)
    event = {"status": "success", "state": "stopped", "generation": 1, "job": JOB, "message": "",
             "dead_after": 60.0}
    result = op.execute_complete({"ti": FakeTI(try_number=2), "run_id": RUN_ID, "task_state_store": store},
                                 event, generation=1, token="tok1", since=0)
    assert result["status"] == "stopped" and catalog.current_generation() == 1


def test_a_new_try_that_deferred_before_the_old_trigger_asked_still_restarts_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordering 3 (seen on the e2e stack: the old trigger's question about the task's state
    took 19 s): the new try defers before the old trigger's `on_kill` has its answer, which
    is then ``deferred``, so the old trigger leaves the run alone. The new try knows from
    the task's record that try 1 deferred on this run (a deferred try ends only by a user's
    action): it stops the run as the cleared try's trigger would, and starts anew."""
    from airflow.sdk.exceptions import TaskDeferred

    root, catalog, store, op, old = deferred_first_try(tmp_path)
    assert store.values["sparkpoint_detached"]["deferred_try"] == 1
    driver = serve_cancel(catalog)
    ti = FakeTI(try_number=2)
    with a_stand_in_spark_submit(tmp_path, root, monkeypatch) as seen:
        with pytest.raises(TaskDeferred) as new:
            op.execute({"ti": ti, "run_id": RUN_ID, "task_state_store": store})
        assert trigger_kwargs_of(new)["generation"] == 2 and catalog.current_generation() == 2
        assert json.loads(seen.read_text())["state"] == "stopped"
    driver.join(10)
    channel = ControlChannel(catalog)
    requests = [channel.read_request(i) for i in channel.request_ids()]
    assert [(r.kind, r.generation) for r in requests] == [("cancel", 1)]
    assert requests[0].requested_by.endswith(", try 1"), requests[0].requested_by
    assert store.values["sparkpoint_detached"]["deferred_try"] == 2
    old_trigger_kills(root, trigger_kwargs_of(old), state="deferred")  # too late: it asks, writes nothing
    assert len(channel.request_ids()) == 1 and catalog.current_generation() == 2


def test_the_triggers_task_try_number_is_checked_and_named_by_its_stop(tmp_path: Path) -> None:
    from airflow_sparkpoint.exceptions import ConfigError
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    task = {"dag_id": "etl", "task_id": "submit", "run_id": RUN_ID, "map_index": 3}
    for bad in ("2", True, 2.0):
        with pytest.raises(ConfigError, match="try_number"):
            SparkpointRunTrigger(job_name=JOB, generation=1, checkpoint_dir=str(tmp_path),
                                 task={**task, "try_number": bad})
    trig = SparkpointRunTrigger(job_name=JOB, generation=1, checkpoint_dir=str(tmp_path),
                                task={**task, "try_number": 4})
    assert trig.serialize()[1]["task"]["try_number"] == 4
    assert trig.user_stop_by() == ("SparkpointRunTrigger (the task was stopped) by task instance "
                                   f"etl.submit[3] of DAG run {RUN_ID}, try 4")
    older = SparkpointRunTrigger(job_name=JOB, generation=1, checkpoint_dir=str(tmp_path), task=task)
    assert older.user_stop_by().startswith("SparkpointRunTrigger (the task was stopped)")
    assert "try" not in older.user_stop_by()
