"""The Airflow layer without Spark: template rendering, deferral hand-off, the trigger
(serialization, events, `run()`), the sensor condition against hand-built catalogs,
connection parsing and secrets handling.

Catalogs live under ``tmp_path``; checkpoints and savepoints are written with the
Catalog API from hand-built `SnapshotMetadata`, and the "running job" is a status
record (plus, for control requests, a thread that answers them).
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_sinks import FakeSink
from tests.support.records import confirm, put_checkpoint, transaction_record, write_status
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow

SECRET = "s3cr3t-value"
JOB = "orders"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


# ---------------------------------------------------------------------------- helpers


def claim(catalog: Catalog, generation: int) -> None:
    while catalog.current_generation() < generation:
        catalog.claim_generation()


def set_status(catalog: Catalog, generation: int, state: str = "running", **fields: Any) -> None:
    """`write_status` of `generation`'s run on worker-1 (`fields`: ``heartbeat_age``,
    ``checkpoints_completed``, ``error``, ...)."""
    write_status(catalog, state, generation=generation, host="worker-1", pid=4242, **fields)


def collect(trigger: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [event async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(run(), timeout=60))


# ---------------------------------------------------------------------------- template fields


def test_every_templated_field_renders(root: str) -> None:
    from airflow_sparkpoint.operators import (
        SparkpointCommitOperator,
        SparkpointSavepointOperator,
        SparkpointSubmitOperator,
    )
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    context: Any = {"params": {"v": "X"}, "ds": "2026-01-01"}
    tpl = "{{ params.v }}"
    submit = SparkpointSubmitOperator(
        task_id="submit", job_name=f"job-{tpl}", checkpoint_dir=f"/data/{tpl}", restore=f"/sp/{tpl}",
        trigger="processingTime:{{ params.v | length }}s", checkpoint_interval="{{ 1 + 1 }}s",
        work_dir=f"/work/{tpl}", sparkpoint_conf={"state.store": tpl},
        application=f"/app/{tpl}.py", conf={"spark.x": tpl}, files=f"f-{tpl}", py_files=f"p-{tpl}",
        jars=f"j-{tpl}", driver_class_path=f"d-{tpl}", packages=f"pk-{tpl}", exclude_packages=f"e-{tpl}",
        keytab=f"k-{tpl}", principal=f"pr-{tpl}", proxy_user=f"u-{tpl}", name=f"n-{tpl}",
        application_args=["--input", f"/in/{tpl}"], env_vars={"E": tpl}, post_submit_commands=[f"echo {tpl}"],
        properties_file=f"props-{tpl}",
    )
    savepoint = SparkpointSavepointOperator(task_id="sp", job_name=f"job-{tpl}",
                                            checkpoint_dir=f"/data/{tpl}")
    commit = SparkpointCommitOperator(task_id="commit", job_name=f"job-{tpl}", checkpoint_dir=f"/data/{tpl}",
                                      abort_generation="{{ 3 }}", upto_batch="{{ 2 + 5 }}")
    sensor = SparkpointCheckpointSensor(
        task_id="sensor", job_name=f"job-{tpl}", checkpoint_dir=f"/data/{tpl}", generation="{{ 4 }}",
        after_checkpoint_id="{{ 7 }}", after_time="{{ ds }}T00:00:00+00:00",
    )
    operators = [submit, savepoint, commit, sensor]
    for op in operators:
        op.render_template_fields(context)
        for name in op.template_fields:
            rendered = json.dumps(getattr(op, name), default=str)
            assert "{{" not in rendered, f"{type(op).__name__}.{name} not rendered: {rendered}"
    assert submit.job_name == "job-X" and submit.checkpoint_dir == "/data/X" and submit.restore == "/sp/X"
    assert submit.trigger == "processingTime:1s" and submit.checkpoint_interval == "2s"
    assert submit.work_dir == "/work/X" and submit.sparkpoint_conf == {"state.store": "X"}
    assert submit.application == "/app/X.py" and submit.conf == {"spark.x": "X"}
    assert submit.application_args == ["--input", "/in/X"] and submit.env_vars == {"E": "X"}
    for name in ("files", "py_files", "jars", "driver_class_path", "packages", "exclude_packages", "keytab",
                 "principal", "proxy_user", "name", "properties_file"):
        assert getattr(submit, name).endswith("-X"), name
    assert submit.post_submit_commands == ["echo X"]
    assert (savepoint.job_name, savepoint.checkpoint_dir) == ("job-X", "/data/X")
    assert (commit.job_name, commit.abort_generation, commit.upto_batch) == ("job-X", "3", "7")
    assert (sensor.job_name, sensor.generation, sensor.after_checkpoint_id) == ("job-X", "4", "7")
    condition = sensor.condition()  # rendered strings parse
    assert (condition.generation, condition.after_checkpoint_id) == (4, 7)
    assert condition.after_time == datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()


def test_rendered_values_that_do_not_parse_name_the_field(root: str) -> None:
    from airflow_sparkpoint.operators import SparkpointCommitOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    sensor = SparkpointCheckpointSensor(task_id="s", job_name=JOB, checkpoint_dir=root,
                                        generation="{{ None }}")
    sensor.render_template_fields({})
    with pytest.raises(ConfigError, match="generation='None'"):
        sensor.condition()
    # A rendered None must never turn a rollback into a commit.
    commit = SparkpointCommitOperator(task_id="c", job_name=JOB, checkpoint_dir=root,
                                      abort_generation="{{ None }}")
    commit.render_template_fields({})
    with pytest.raises(ConfigError, match="abort_generation='None'"):
        commit.execute({})  # type: ignore[arg-type]


def test_constructor_validation() -> None:
    from airflow_sparkpoint.operators import SparkpointSavepointOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    # Neither a storage root nor a connection: the default connection (test_api_defaults.py).
    assert SparkpointSavepointOperator(task_id="a", job_name=JOB).sparkpoint_conn_id == "sparkpoint_default"
    with pytest.raises(ConfigError, match="max_count=0"):
        SparkpointSavepointOperator(task_id="b", job_name=JOB, checkpoint_dir="/x", max_count=0)
    with pytest.raises(ConfigError, match="min_checkpoints=0"):
        SparkpointCheckpointSensor(task_id="c", job_name=JOB, checkpoint_dir="/x", min_checkpoints=0)


# ---------------------------------------------------------------------------- deferral


def test_deferrable_sensor_defers_with_the_trigger(catalog: Catalog, root: str) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    sensor = SparkpointCheckpointSensor(task_id="wait", job_name=JOB, checkpoint_dir=root, generation=1,
                                        min_checkpoints=3, deferrable=True, timeout=120, poke_interval=3)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, SparkpointCheckpointTrigger)
    assert deferred.value.method_name == "execute_complete"
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_sparkpoint.triggers.checkpoint.SparkpointCheckpointTrigger"
    assert kwargs["mode"] == "checkpoint" and kwargs["generation"] == 1 and kwargs["min_checkpoints"] == 3
    assert kwargs["checkpoint_dir"] == root and kwargs["poll_interval"] == 3
    assert time.time() + 100 < kwargs["deadline"] <= time.time() + 120


def test_deferrable_sensor_does_not_defer_when_already_met(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    sensor = SparkpointCheckpointSensor(task_id="wait", job_name=JOB, checkpoint_dir=root, deferrable=True)
    payload = sensor.execute({})  # type: ignore[arg-type]
    assert (payload["checkpoint_id"] == meta.id
            and payload["checkpoint_uri"] == catalog.checkpoint_uri(meta.id))


@pytest.mark.parametrize("stop", [False, True])
def test_deferrable_savepoint_operator_submits_then_defers(catalog: Catalog, root: str, stop: bool) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_sparkpoint.operators import SparkpointSavepointOperator
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    put_checkpoint(catalog, generation=2)
    set_status(catalog, 2)
    op = SparkpointSavepointOperator(task_id="sp", job_name=JOB, checkpoint_dir=root, stop=stop,
                                     deferrable=True, timeout=30, poll_interval=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, SparkpointCheckpointTrigger)
    assert deferred.value.method_name == "execute_complete"
    _, kwargs = trigger.serialize()
    pending = ControlChannel(catalog).pending(2)
    assert [(r.id, r.kind, r.generation) for r in pending] == [
        (kwargs["request_id"], "stop" if stop else "savepoint", 2)
    ]
    assert kwargs["mode"] == "control_result" and kwargs["generation"] == 2


# ---------------------------------------------------------------------------- the trigger


def test_trigger_serialize_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk._shared.module_loading import import_string

    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    monkeypatch.setenv("AIRFLOW_CONN_SP_ROUND", json.dumps(
        {"conn_type": "sparkpoint", "host": "s3://b/p", "login": "AKIAEXAMPLE", "password": SECRET}))
    for trigger in (
        SparkpointCheckpointTrigger(job_name=JOB, sparkpoint_conn_id="sp_round", generation=3,
                                    min_checkpoints=2,
                                    after_time=1_700_000_000.5, progress_within=30, deadline=1_800_000_000.0),
        SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir="/data/sp", savepoint=True,
                                    after_checkpoint_id=4),
        SparkpointCheckpointTrigger(job_name=JOB, mode="control_result", sparkpoint_conn_id="sp_round",
                                    request_id="1700000000000-0123abcd", generation=2, poll_interval=0.5),
    ):
        classpath, kwargs = trigger.serialize()
        assert classpath == "airflow_sparkpoint.triggers.checkpoint.SparkpointCheckpointTrigger"
        text = json.dumps(kwargs)  # JSON-safe
        assert SECRET not in text and "AKIAEXAMPLE" not in text
        rebuilt = import_string(classpath)(**json.loads(text))
        assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "poll"}, "mode='poll'"),
        ({"job_name": "bad name"}, "job name 'bad name'"),
        ({"mode": "control_result", "request_id": "nope"}, "request_id='nope'"),
        ({"request_id": "1700000000000-0123abcd"}, "only valid with mode 'control_result'"),
        ({"generation": 0}, "generation=0"),
        ({"min_checkpoints": 0}, "min_checkpoints=0"),
        ({"poll_interval": -1}, "poll_interval=-1"),
        ({"max_heartbeat_age": float("nan")}, "max_heartbeat_age=nan"),
        ({"deadline": "soon"}, "deadline='soon'"),
        ({"after_time": "yesterday"}, "after_time='yesterday'"),
        ({"savepoint": True, "progress_within": 5}, "progress_within=5"),
    ],
)
def test_trigger_validates_kwargs(kwargs: dict[str, Any], message: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    base: dict[str, Any] = {"job_name": JOB, "checkpoint_dir": "/data/sp"}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SparkpointCheckpointTrigger(**{**base, **kwargs})


@pytest.mark.parametrize(
    "event",
    [None, "done", ["status", "success"], {}, {"status": "weird"}, {"status": "success"},
     {"status": "success", "checkpoint_uri": "", "generation": 1}],
)
def test_execute_complete_rejects_malformed_events(root: str, event: Any) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.operators import SparkpointSavepointOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    sensor = SparkpointCheckpointSensor(task_id="s", job_name=JOB, checkpoint_dir=root, deferrable=True)
    savepoint = SparkpointSavepointOperator(task_id="p", job_name=JOB, checkpoint_dir=root, deferrable=True)
    with pytest.raises(AirflowException, match="malformed"):
        sensor.execute_complete({}, event)  # type: ignore[arg-type]
    with pytest.raises(AirflowException, match="malformed"):
        savepoint.execute_complete({}, event)  # type: ignore[arg-type]


def test_execute_complete_raises_error_events_and_returns_payloads(root: str) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

    from airflow_sparkpoint.operators import SparkpointSavepointOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    sensor = SparkpointCheckpointSensor(task_id="s", job_name=JOB, checkpoint_dir=root, deferrable=True)
    savepoint = SparkpointSavepointOperator(task_id="p", job_name=JOB, checkpoint_dir=root, deferrable=True)
    for op in (sensor, savepoint):
        with pytest.raises(AirflowException, match="generation 3 .* failed: boom"):
            op.execute_complete({}, {"status": "error", "message": "generation 3 of job failed: boom"})
        with pytest.raises(AirflowSensorTimeout, match="timed out"):
            op.execute_complete({}, {"status": "error", "message": "timed out", "reason": "timeout"})
    event = {"status": "success", "kind": "checkpoint", "checkpoint_id": 4, "checkpoint_uri": "/x/chk-4",
             "generation": 2}
    assert sensor.execute_complete({}, event) == {k: v for k, v in event.items() if k != "status"}
    sp_event = {"status": "success", "savepoint_uri": "/x/savepoints/savepoint-4-ab", "generation": 2}
    assert savepoint.execute_complete({}, sp_event) == "/x/savepoints/savepoint-4-ab"


def test_trigger_run_yields_one_success_event(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root, generation=1, min_checkpoints=2,
                                          poll_interval=0.05, deadline=time.time() + 30)
    # As the runtime does: the status record is rewritten after every completed checkpoint
    # (a waiting trigger reads only the status until it moves).
    writer = threading.Timer(0.3, lambda: (put_checkpoint(catalog, generation=1),
                                           set_status(catalog, 1, checkpoints_completed=2)))
    writer.start()
    try:
        events = collect(trigger)
    finally:
        writer.join()
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "success" and payload["generation"] == 1 and payload["count"] == 2
    assert payload["checkpoint_id"] == 2 and payload["checkpoint_uri"] == catalog.checkpoint_uri(2)


def test_trigger_run_yields_one_error_event_when_the_job_fails(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1, "failed", error="executor lost")
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root, min_checkpoints=2,
                                          poll_interval=0.05)
    events = collect(trigger)
    assert [e.payload["status"] for e in events] == ["error"]
    assert "failed: executor lost" in events[0].payload["message"]


def test_trigger_run_times_out_at_its_deadline(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    set_status(catalog, 1)
    claim(catalog, 1)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root, poll_interval=0.05,
                                          deadline=time.time() + 0.3)
    events = collect(trigger)
    assert len(events) == 1 and events[0].payload["reason"] == "timeout"
    assert "0/1 matching checkpoints" in events[0].payload["message"]


def _serve_one_request(catalog: Catalog, generation: int, savepoint_uri: str, stop: threading.Event) -> None:
    """The job's side of the control channel, as the coordinator thread does it."""
    channel = ControlChannel(catalog)
    while not stop.is_set():
        set_status(catalog, generation)  # heartbeat
        for request in channel.pending(generation):
            channel.acknowledge(request, generation)
            channel.complete(request, generation=generation, savepoint=savepoint_uri, batch_id=7)
            return
        time.sleep(0.05)


def test_trigger_control_result_completes(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    handle = catalog.create_savepoint(catalog.handle(meta))
    request = ControlChannel(catalog).submit("savepoint", timeout_s=30, generation=1)
    stop = threading.Event()
    job = threading.Thread(target=_serve_one_request, args=(catalog, 1, handle.uri, stop))
    job.start()
    try:
        events = collect(SparkpointCheckpointTrigger(
            job_name=JOB, checkpoint_dir=root, mode="control_result", request_id=request.id, generation=1,
            poll_interval=0.05, deadline=time.time() + 30,
        ))
    finally:
        stop.set()
        job.join()
    assert len(events) == 1
    assert events[0].payload == {"status": "success", "kind": "savepoint", "job": JOB,
                                 "request_id": request.id, "generation": 1, "batch_id": 7,
                                 "savepoint_uri": handle.uri}


def test_trigger_control_result_fails_when_the_job_is_dead(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    claim(catalog, 1)
    set_status(catalog, 1, heartbeat_age=120)
    channel = ControlChannel(catalog)
    request = channel.submit("stop", timeout_s=30, generation=1)
    started = time.monotonic()
    events = collect(SparkpointCheckpointTrigger(
        job_name=JOB, checkpoint_dir=root, mode="control_result", request_id=request.id, generation=1,
        max_heartbeat_age=10, poll_interval=0.05, deadline=time.time() + 30,
    ))
    assert time.monotonic() - started < 5
    assert [e.payload["status"] for e in events] == ["error"]
    assert "not running" in events[0].payload["message"]
    assert channel.result(request.id).state == "expired"  # withdrawn: no later run takes it
    assert channel.pending() == []


# ---------------------------------------------------------------------------- sensor conditions


def _sensor(root: str, **kwargs: Any) -> Any:
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    return SparkpointCheckpointSensor(task_id="wait", job_name=JOB, checkpoint_dir=root, **kwargs)


def test_sensor_waits_for_n_checkpoints_of_a_generation(catalog: Catalog, root: str) -> None:
    put_checkpoint(catalog, generation=1)
    put_checkpoint(catalog, generation=2)
    set_status(catalog, 2, checkpoints_completed=1)
    sensor = _sensor(root, generation=2, min_checkpoints=2)
    assert sensor.poke({}) is False
    meta = put_checkpoint(catalog, generation=2)
    result = sensor.poke({})
    assert result and result.xcom_value["checkpoint_id"] == meta.id and result.xcom_value["count"] == 2
    # The run's own count covers checkpoints retention has already removed.
    set_status(catalog, 2, checkpoints_completed=5)
    assert _sensor(root, generation=2, min_checkpoints=5).poke({})


def test_sensor_waits_for_a_checkpoint_newer_than_an_id_or_time(catalog: Catalog, root: str) -> None:
    first = put_checkpoint(catalog, generation=1, created_at=time.time() - 50)
    set_status(catalog, 1)
    assert _sensor(root, after_checkpoint_id=first.id).poke({}) is False
    assert _sensor(root, after_time=datetime.now(timezone.utc) - timedelta(seconds=10)).poke({}) is False
    newer = put_checkpoint(catalog, generation=1)
    for sensor in (_sensor(root, after_checkpoint_id=first.id), _sensor(root, after_time=time.time() - 10)):
        result = sensor.poke({})
        assert result and result.xcom_value["checkpoint_id"] == newer.id


def test_sensor_waits_for_a_savepoint(catalog: Catalog, root: str) -> None:
    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    old = catalog.create_savepoint(catalog.handle(meta))
    time.sleep(0.01)
    since = time.time()
    sensor = _sensor(root, savepoint=True, after_time=since)
    assert sensor.poke({}) is False
    handle = catalog.create_savepoint(catalog.handle(meta))
    result = sensor.poke({})
    assert result and result.xcom_value["savepoint_uri"] == handle.uri != old.uri
    assert result.xcom_value["kind"] == "savepoint"


def test_sensor_progress_within(catalog: Catalog, root: str) -> None:
    put_checkpoint(catalog, generation=1, created_at=time.time() - 120)
    set_status(catalog, 1)
    sensor = _sensor(root, progress_within=30)
    assert sensor.poke({}) is False  # the last checkpoint is two minutes old
    put_checkpoint(catalog, generation=1)
    assert sensor.poke({})
    set_status(catalog, 1, heartbeat_age=45)  # alive (max 60 s) but not healthy
    assert sensor.poke({}) is False


def _supersede(catalog: Catalog, generation: int) -> None:
    claim(catalog, generation)
    set_status(catalog, generation)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda c: set_status(c, 1, "failed", error="OOM in executor 3"), "failed: OOM in executor 3"),
        (lambda c: set_status(c, 1, heartbeat_age=600), "heartbeat is 600 s old"),
        (lambda c: set_status(c, 1, "finished"), "finished at .* before"),
        (lambda c: _supersede(c, 2), "superseded by generation 2"),
    ],
    ids=["failed", "stale-heartbeat", "finished-early", "superseded"],
)
def test_sensor_fails_promptly(catalog: Catalog, root: str, setup: Any, message: str) -> None:
    from airflow.sdk.exceptions import AirflowException

    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    setup(catalog)
    sensor = _sensor(root, generation=1, min_checkpoints=3, timeout=600, poke_interval=0.1)
    started = time.monotonic()
    with pytest.raises(AirflowException, match=message):
        sensor.execute({})  # type: ignore[arg-type]
    assert time.monotonic() - started < 5


def test_sensor_waits_for_a_generation_that_has_not_started(catalog: Catalog, root: str) -> None:
    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1, "stopped")
    assert _sensor(root, generation=2).poke({}) is False  # green has not reported yet


def test_sensor_poke_mode_returns_the_snapshot(catalog: Catalog, root: str) -> None:
    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1, "finished")
    payload = _sensor(root, generation=1, poke_interval=0.1, timeout=5).execute({})
    assert payload["checkpoint_id"] == meta.id and payload["generation"] == 1


# ---------------------------------------------------------------------------- savepoint and commit (no Spark)


def test_savepoint_operator_from_checkpoint_when_not_running(catalog: Catalog, root: str) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.operators import SparkpointSavepointOperator

    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1, "stopped")
    uris = []
    for _ in range(3):
        op = SparkpointSavepointOperator(task_id="sp", job_name=JOB, checkpoint_dir=root, stop=True,
                                         max_count=2)
        uris.append(op.execute({}))  # type: ignore[arg-type]
        time.sleep(0.01)
    kept = [e.uri for e in catalog.list_savepoints() if e.valid]
    assert kept == [uris[2], uris[1]]  # retention: two newest
    assert all(e.metadata and e.metadata.source_checkpoint == meta.id for e in catalog.list_savepoints())
    refuse = SparkpointSavepointOperator(task_id="sp2", job_name=JOB, checkpoint_dir=root,
                                         from_checkpoint_if_not_running=False)
    with pytest.raises(AirflowException, match="from_checkpoint_if_not_running=False"):
        refuse.execute({})  # type: ignore[arg-type]


def test_savepoint_operator_poke_mode_against_a_live_job(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.operators import SparkpointSavepointOperator

    meta = put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    handle = catalog.create_savepoint(catalog.handle(meta))
    stop = threading.Event()
    job = threading.Thread(target=_serve_one_request, args=(catalog, 1, handle.uri, stop))
    job.start()
    try:
        op = SparkpointSavepointOperator(task_id="sp", job_name=JOB, checkpoint_dir=root, poll_interval=0.05,
                                         timeout=30)
        assert op.execute({}) == handle.uri  # type: ignore[arg-type]
    finally:
        stop.set()
        job.join()


def test_commit_operator_with_nothing_staged_is_a_noop(catalog: Catalog, root: str) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.operators import SparkpointCommitOperator

    put_checkpoint(catalog, generation=1)
    set_status(catalog, 1)
    op = SparkpointCommitOperator(task_id="c", job_name=JOB, checkpoint_dir=root)
    assert op.execute({}) == {"committed": [], "already": [], "aborted": [], "pending": []}  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="abort_generation='0'"):
        SparkpointCommitOperator(task_id="a", job_name=JOB, checkpoint_dir=root,
                                 abort_generation="0").execute({})  # type: ignore[arg-type]
    with pytest.raises(AirflowException, match="still running"):
        SparkpointCommitOperator(task_id="b", job_name=JOB, checkpoint_dir=root,
                                 abort_generation=1).execute({})  # type: ignore[arg-type]
    set_status(catalog, 1, "stopped")
    assert SparkpointCommitOperator(task_id="d", job_name=JOB, checkpoint_dir=root,
                                    abort_generation="1").execute({}) == {"aborted": []}  # type: ignore[arg-type]


def test_commit_operator_with_a_declared_sink_refuses_a_record_for_another_sink(
        catalog: Catalog, root: str, tmp_path: Path) -> None:
    from airflow_sparkpoint.exceptions import SinkError
    from airflow_sparkpoint.operators import SparkpointCommitOperator
    from airflow_sparkpoint.sinks.directory import DirectorySink

    put_checkpoint(catalog, generation=1, batch_id=3)
    other = DirectorySink(str(tmp_path / "elsewhere"), "json")
    catalog.put_transaction(transaction_record(other, 1, 1, {"staging": "_staging/x", "files": []}, job=JOB))
    with pytest.raises(ConfigError, match="is not a sink"):
        SparkpointCommitOperator(task_id="bad", job_name=JOB, checkpoint_dir=root, sink={"uri": "/x"})
    for declared in (DirectorySink(str(tmp_path / "out"), "json"),
                     {"kind": "directory", "uri": str(tmp_path / "out"), "format": "json"}):
        op = SparkpointCommitOperator(task_id="c", job_name=JOB, checkpoint_dir=root, sink=declared)
        with pytest.raises(SinkError, match="does not match the declared sink"):
            op.execute({})  # type: ignore[arg-type]
    assert [r.txn_id for r in catalog.transactions()] == [f"{JOB}-b1-g1"]


def test_commit_operator_commits_then_rolls_back_green(
    catalog: Catalog, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sparkpoint.operators import SparkpointCommitOperator

    monkeypatch.setenv("AIRFLOW_CONN_SP_COMMIT", json.dumps(
        {"conn_type": "sparkpoint", "host": root, "login": "AKIAEXAMPLE", "password": SECRET}))
    name = f"w-{time.time_ns()}"
    # Blue (generation 1) staged batches 0 and 1; its checkpoint confirms both.
    blue = (transaction_record(FakeSink(name), 0, 1, {"rows": 1}, job=JOB),
            transaction_record(FakeSink(name), 1, 1, {"rows": 1}, job=JOB))
    confirm(catalog, *blue)
    set_status(catalog, 1, "stopped")
    commit = SparkpointCommitOperator(task_id="commit", job_name=JOB, sparkpoint_conn_id="sp_commit")
    result = commit.execute({})  # type: ignore[arg-type]
    assert result == {"committed": [r.txn_id for r in blue], "already": [], "aborted": [], "pending": []}
    assert SECRET not in json.dumps(result)
    world = FakeSink.worlds[name]
    assert world["configured"][-1]["aws_secret_access_key"] == SECRET  # the connection reaches the sink
    # Green (generation 2) staged batches 2 and 3, one of them confirmed; then the rollback.
    green = (transaction_record(FakeSink(name), 2, 2, {"rows": 1}, job=JOB),
             transaction_record(FakeSink(name), 3, 2, {"rows": 1}, job=JOB))
    confirm(catalog, green[0])
    catalog.put_transaction(green[1])  # staged, not confirmed
    set_status(catalog, 2, "stopped")
    rollback = SparkpointCommitOperator(task_id="rollback", job_name=JOB, checkpoint_dir=root,
                                        abort_generation="{{ params.green }}")
    rollback.render_template_fields({"params": {"green": 2}})  # type: ignore[arg-type]
    assert rollback.execute({}) == {"aborted": [r.txn_id for r in green]}  # type: ignore[arg-type]
    assert rollback.execute({}) == {"aborted": []}  # type: ignore[arg-type]  # a retry is a no-op
    assert sorted(world["committed"]) == [0, 1] and world["aborted"] == [r.txn_id for r in green]
    assert catalog.transactions() == []


# ---------------------------------------------------------------------------- connection and secrets


def test_provider_declares_the_connection_form() -> None:
    """Airflow finds the provider, hook and form without importing the hook's deprecated
    form methods (warnings are errors here); the declared form matches the hook's."""
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_sparkpoint.get_provider_info import get_provider_info
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointSavepointOperator, SparkpointSubmitOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    [declared] = get_provider_info()["connection-types"]
    form = SparkpointHook.get_ui_field_behaviour()
    behaviour = declared["ui-field-behaviour"]
    assert behaviour["hidden-fields"] == form["hidden_fields"]
    assert behaviour["relabeling"] == form["relabeling"] and behaviour["placeholders"] == form["placeholders"]
    manager = ProvidersManager()
    assert "airflow-sparkpoint" in manager.providers
    assert manager.field_behaviours["sparkpoint"]["relabeling"]["host"] == "Storage URI"
    # The connection's own fields are real form fields (Airflow >= 3.2: conn-fields), not Extra JSON.
    widgets = manager.connection_form_widgets
    for name, label in (("endpoint_url", "S3 endpoint URL"), ("region_name", "S3 region"),
                        ("aws_conn_id", "AWS connection"), ("jobs", "Jobs"),
                        ("pyspark_python", "Python on the Spark cluster")):
        widget = widgets[f"extra__sparkpoint__{name}"]
        assert widget.field["schema"]["title"] == label and widget.field_name == name
    assert "extra" not in behaviour["placeholders"]
    # The extra links of every Sparkpoint operator, declared: the UI registers them from here.
    links = {f"{type(link).__module__}.{type(link).__name__}"
             for op in (SparkpointSubmitOperator, SparkpointSavepointOperator, SparkpointCheckpointSensor)
             for link in op.operator_extra_links}
    assert links == {"airflow_sparkpoint.operators.links.SparkpointSparkUILink",
                     "airflow_sparkpoint.operators.links.SparkpointCheckpointHistoryLink"}
    assert links <= set(get_provider_info()["extra-links"]) <= set(manager.extra_links_class_names)
    hook = ProvidersManagerTaskRuntime().hooks["sparkpoint"]
    assert hook is not None and hook.hook_class_name == "airflow_sparkpoint.hooks.SparkpointHook"


def test_hook_parses_a_json_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    monkeypatch.setenv("AIRFLOW_CONN_SP_TEST", json.dumps({
        "conn_type": "sparkpoint", "host": "s3://b/p", "login": "AKIAEXAMPLE", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
    }))
    hook = SparkpointHook("sp_test")
    assert hook.storage_uri == "s3://b/p"
    assert hook.storage_options == {
        "endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
        "aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": SECRET,
    }
    assert SparkpointHook("sp_test", storage_uri="/override").storage_uri == "/override"


class _FakePopen:
    """Stands in for spark-submit: records the command and environment, then does what
    the job would do (claim a generation, write its run result)."""

    calls: ClassVar[list[tuple[list[str], dict[str, str]]]] = []
    catalog: ClassVar[Catalog | None] = None

    def __init__(self, cmd: list[str], **kwargs: Any) -> None:
        from airflow_sparkpoint.runtime.config import SUBMITTER_ENV

        env = dict(kwargs.get("env") or {})
        type(self).calls.append((list(cmd), env))
        assert self.catalog is not None
        generation = self.catalog.claim_generation({"submitter": env.get(SUBMITTER_ENV)}).generation
        write_run_result(self.catalog,
                         RunResult(status="finished", job=JOB, generation=generation, last_batch=0))
        self.stdout = io.StringIO("INFO spark-submit fake\n")
        self.returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def poll(self) -> int:
        return 0


def test_secret_reaches_only_the_subprocess_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import subprocess
    import types

    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    root = str(tmp_path / "sp")
    monkeypatch.setenv("AIRFLOW_CONN_SP_SECRET", json.dumps({
        "conn_type": "sparkpoint", "host": root, "login": "AKIAEXAMPLE", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
    }))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setattr(_FakePopen, "calls", [])
    monkeypatch.setattr(_FakePopen, "catalog", Catalog(open_storage(root), JOB))
    # Only the Spark provider's hook sees the fake: patching subprocess.Popen itself leaks
    # into modules first imported meanwhile (pyspark's java_gateway binds Popen at import).
    from airflow.providers.apache.spark.hooks import spark_submit

    fake_subprocess = types.ModuleType("subprocess")
    fake_subprocess.__dict__.update(vars(subprocess))
    fake_subprocess.Popen = _FakePopen  # type: ignore[attr-defined]
    monkeypatch.setattr(spark_submit, "subprocess", fake_subprocess)
    op = SparkpointSubmitOperator(
        task_id="submit", application="/app/job.py", job_name=JOB, sparkpoint_conn_id="sp_secret",
        application_args=["--input", "{{ params.input }}"], conf={"spark.ui.enabled": "false"},
    )
    op.render_template_fields({"params": {"input": "/in"}})
    context: Any = {"ti": FakeTI()}
    result = op.execute(context)

    assert result is not None and result["status"] == "finished"
    assert SECRET not in json.dumps(result)
    for name in op.template_fields:
        assert SECRET not in json.dumps(getattr(op, name), default=str), name
    assert op.conf is not None and SECRET not in json.dumps(op.conf)
    assert op.conf["spark.sparkpoint.s3.endpoint"] == "http://127.0.0.1:9"
    [(cmd, env)] = _FakePopen.calls
    assert SECRET not in " ".join(cmd)
    assert SECRET not in " ".join(op._hook._build_spark_submit_command("/app/job.py"))  # type: ignore[union-attr]
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET and env["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"
