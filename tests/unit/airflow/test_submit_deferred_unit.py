"""The deferrable submit without Spark (issue #50): ``deferrable`` follows
``[operators] default_deferrable``; a resumption of the task whose own generation is live
defers on it again (never fencing it), unless a stop or cancel is addressed to it; another
task's live run is still refused; ``execute_complete`` validates its event and ends like
``execute`` (the result), or raises the run's own error, the dead bound, the timeout.

A real local catalog; the driver's records are written as the runtime writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.services.follow import reattach_target
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


def operator(root: Path, **kwargs: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    kwargs.setdefault("deferrable", True)
    return SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB,
                                    checkpoint_dir=str(root), **kwargs)


def live_run(catalog: Catalog, dag_id: str, *, token: str = "tok1") -> int:
    """A live run started by try 1 of task ``submit`` of `dag_id` in DAG run `RUN_ID`."""
    return live_submit_run(catalog, dag_id, token=token, run_id=RUN_ID)


def test_deferrable_follows_default_deferrable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert operator(tmp_path, deferrable=None).deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert operator(tmp_path, deferrable=None).deferrable is True
    assert operator(tmp_path, deferrable=False).deferrable is False


@pytest.mark.parametrize(("with_store", "claimed_when_lost"), [(True, True), (True, False), (False, None)])
def test_a_retry_of_the_task_re_attaches_to_its_own_live_run(tmp_path: Path, with_store: bool,
                                                             claimed_when_lost: bool | None) -> None:
    """The first try launched the driver and was lost (its worker died) after the driver
    claimed its generation, or before (its record names the launch, not yet the generation)."""
    from airflow.sdk.exceptions import TaskDeferred

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    op = operator(root)
    generation = live_run(catalog, op.dag_id)
    process = {"host": "worker-9", "boot_id": "b", "pgid": 777, "leader_start": "5", "log": "/x/driver.log"}
    store = FakeStore() if with_store else None
    if store is not None:
        TaskRecord(1, "latest", ("tok1",), 0).save(store)
        store.set("sparkpoint_detached", {"generation": generation if claimed_when_lost else None,
                                          "token": "tok1", "since": 0,
                                          "process": process, "deadline": None})
    ti = FakeTI(try_number=2)
    context: Any = {"ti": ti, "run_id": RUN_ID, **({"task_state_store": store} if store else {})}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    path, kwargs = deferred.value.trigger.serialize()
    assert path.endswith("SparkpointRunTrigger") and kwargs["generation"] == generation
    assert kwargs["process"] == (process if with_store else None)
    assert deferred.value.kwargs == {"generation": generation, "token": "tok1", "since": 0}
    assert catalog.current_generation() == generation, "the resumption started a new generation"
    assert ti.pushed["generation"] == generation
    if store is not None:  # re-attached: nothing new recorded (the record of the launch stays)
        assert store.values["sparkpoint_detached"]["token"] == "tok1"


def test_a_stop_or_cancel_addressed_to_the_run_means_a_new_start(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "sp")), JOB)
    generation = live_run(catalog, "etl")
    me = AirflowTry("etl", "submit", RUN_ID, 2, None)
    assert reattach_target(catalog, me, own=None, max_heartbeat_age=60).generation == generation
    assert reattach_target(catalog, me, own=[generation + 5], max_heartbeat_age=60) is None  # not its own
    assert reattach_target(catalog, AirflowTry("other", "submit", RUN_ID, 1, None), own=None,
                           max_heartbeat_age=60) is None
    ControlChannel(catalog).submit("cancel", generation=generation, requested_by="a user")
    assert reattach_target(catalog, me, own=None, max_heartbeat_age=60) is None


def test_another_tasks_live_run_is_still_refused(tmp_path: Path) -> None:
    from airflow_sparkpoint.exceptions import JobAlreadyRunning

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    live_run(catalog, "production")
    with pytest.raises(JobAlreadyRunning, match="generation 1"):
        operator(root).execute({"ti": FakeTI(), "run_id": RUN_ID})
    assert catalog.current_generation() == 1


def complete(op: Any, event: Any, ti: FakeTI | None = None) -> Any:
    return op.execute_complete({"ti": ti or FakeTI(), "run_id": RUN_ID}, event, generation=1, token="tok1",
                               since=0)


def test_execute_complete_ends_like_execute_or_raises_the_runs_own_error(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout

    from airflow_sparkpoint.operators.driver_errors import SparkpointRunFailed

    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), JOB)
    op = operator(root)
    live_run(catalog, op.dag_id)
    base = {"generation": 1, "job": JOB, "message": "", "dead_after": 60.0}

    for bad in (None, "success", {"status": "done", "generation": 1},
                {**base, "status": "success", "generation": 2}):
        with pytest.raises(AirflowException, match="malformed|follows generation 1"):
            complete(op, bad)
    with pytest.raises(AirflowException, match="silent for more than 60 s"):
        complete(op, {**base, "status": "dead", "message": ""})
    with pytest.raises(AirflowTaskTimeout):
        complete(op, {**base, "status": "timeout", "message": "ran past"})

    write_status(catalog, "failed", generation=1, error="ValueError: bad row 7")
    with pytest.raises(SparkpointRunFailed, match="job 'orders' failed: ValueError: bad row 7"):
        complete(op, {**base, "status": "failed", "message": "ValueError: bad row 7"})

    write_status(catalog, "stopped", generation=1)
    write_run_result(catalog, RunResult(status="stopped", job=JOB, generation=1, batches_processed=3))
    ti = FakeTI()
    result = complete(op, {**base, "status": "success", "state": "stopped"}, ti)
    assert result["status"] == "stopped" and result["generation"] == 1 and result["batches_processed"] == 3
    assert ti.pushed["generation"] == 1 and ti.pushed["spark_application"]["generation"] == 1


@pytest.mark.parametrize(("kind", "expected"), [("RestoreError", "SparkpointRunFailed"),
                                                ("ConfigError", "SparkpointConfigFailure")])
def test_a_detached_driver_that_ends_before_its_claim_is_the_tasks_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, expected: str) -> None:
    """spark-submit is a stand-in script (the process edge) run by the real detached
    launcher; its output goes to the driver log, which the task reads for the error."""
    import os
    import stat

    from airflow_sparkpoint.operators import driver_errors, submit_checks

    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    line = "SPARKPOINT_ERROR " + json.dumps({"type": kind, "message": "no savepoint at s3://b/x"})
    fake.write_text(f"#!/bin/sh\necho 'starting'\necho '{line}'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "nospark"))
    root = tmp_path / "sp"
    types = {"SparkpointRunFailed": driver_errors.SparkpointRunFailed,
             "SparkpointConfigFailure": submit_checks.SparkpointConfigFailure}
    store = FakeStore()
    with pytest.raises(types[expected], match=f"job 'orders' failed: {kind}: no savepoint at s3://b/x"):
        operator(root).execute({"ti": FakeTI(), "run_id": RUN_ID, "task_state_store": store})
    assert Catalog(open_storage(str(root)), JOB).current_generation() == 0
    from airflow.sdk.execution_time.context import NEVER_EXPIRE

    # the task's record across tries outlives the store's default 30 days (a streaming job does)
    assert store.retention["sparkpoint_submit"] is NEVER_EXPIRE
