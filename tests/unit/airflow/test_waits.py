"""The waiting side of the provider (issue #19): `deferrable` defaults from Airflow's
config, `soft_fail` skips on every failure path, the savepoint operator and the trigger
withdraw the control request they filed when the task is stopped, the trigger reads its
connection with the async API and releases its storage client.

Catalogs live under ``tmp_path``; the "running job" is a status record.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.support.records import write_status
from tests.support.waits import wait_for

pytestmark = pytest.mark.airflow

JOB = "orders"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def running(catalog: Catalog, generation: int = 1, state: str = "running", error: str | None = None) -> None:
    while catalog.current_generation() < generation:
        catalog.claim_generation()
    write_status(catalog, state, generation=generation, error=error)


# ---------------------------------------------------------------------------- deferrable default


@pytest.mark.parametrize("configured", [True, False])
def test_deferrable_defaults_from_operators_default_deferrable(
    root: str, monkeypatch: pytest.MonkeyPatch, configured: bool
) -> None:
    from airflow_sparkpoint.operators import SparkpointSavepointOperator
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", str(configured))
    sensor = SparkpointCheckpointSensor(task_id="s", job_name=JOB, checkpoint_dir=root)
    savepoint = SparkpointSavepointOperator(task_id="p", job_name=JOB, checkpoint_dir=root)
    assert sensor.deferrable is configured and savepoint.deferrable is configured
    explicit = SparkpointCheckpointSensor(task_id="e", job_name=JOB, checkpoint_dir=root,
                                          deferrable=not configured)
    assert explicit.deferrable is (not configured)


# ---------------------------------------------------------------------------- soft_fail


@pytest.mark.parametrize("deferrable", [False, True])
def test_soft_fail_skips_when_the_job_failed(catalog: Catalog, root: str, deferrable: bool) -> None:
    """The fail-fast path (the job failed, was superseded or died) skips with soft_fail,
    in poke mode and before deferring alike, as a timeout and a trigger error do."""
    from airflow.sdk.exceptions import AirflowException, AirflowSkipException

    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    running(catalog, state="failed", error="executor lost")
    common: dict[str, Any] = {"job_name": JOB, "checkpoint_dir": root, "deferrable": deferrable,
                              "poke_interval": 0.1, "timeout": 30}
    with pytest.raises(AirflowSkipException, match="failed: executor lost"):
        SparkpointCheckpointSensor(task_id="soft", soft_fail=True, **common).execute({})  # type: ignore[arg-type]
    with pytest.raises(AirflowException, match="failed: executor lost") as hard:
        SparkpointCheckpointSensor(task_id="hard", **common).execute({})  # type: ignore[arg-type]
    assert not isinstance(hard.value, AirflowSkipException)


@pytest.mark.parametrize("event", [
    {"status": "error", "message": "generation 1 of job 'orders' failed: boom"},
    {"status": "error", "message": "timed out", "reason": "timeout"},
    {"status": "weird"},
])
def test_soft_fail_skips_every_deferred_failure(root: str, event: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    sensor = SparkpointCheckpointSensor(task_id="s", job_name=JOB, checkpoint_dir=root, deferrable=True,
                                        soft_fail=True)
    with pytest.raises(AirflowSkipException):
        sensor.resume_execution("execute_complete", {"event": event}, {})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- withdrawing requests


def test_savepoint_operator_on_kill_withdraws_its_untaken_request(catalog: Catalog, root: str) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.operators import SparkpointSavepointOperator

    running(catalog, generation=2)
    op = SparkpointSavepointOperator(task_id="sp", job_name=JOB, checkpoint_dir=root, stop=True, timeout=120,
                                     poll_interval=0.05, deferrable=False)
    outcome: dict[str, BaseException] = {}

    def waiting() -> None:
        try:
            op.execute({})  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    thread = threading.Thread(target=waiting)
    thread.start()

    def filed() -> str | None:
        running(catalog, generation=2)  # heartbeat: the job looks alive, but never answers
        return op.request_id

    wait_for("the operator to file a request", filed, 60, interval=0.05)
    op.on_kill()
    thread.join(60)
    channel = ControlChannel(catalog)
    result = channel.result(op.request_id)
    assert result.state == "expired" and "task sp was killed while waiting" in (result.error or "")
    assert channel.pending() == [], "no run (this one or a later one) can take it now"
    assert isinstance(outcome.get("error"), AirflowException)


def test_savepoint_operator_on_kill_leaves_a_taken_request_to_its_run(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.operators import SparkpointSavepointOperator

    running(catalog)
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1)
    channel.acknowledge(request, 1)
    op = SparkpointSavepointOperator(task_id="sp", job_name=JOB, checkpoint_dir=root)
    op.request_id = request.id
    op.on_kill()
    assert channel.result(request.id).state == "acknowledged"


def collect(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_trigger_on_kill_withdraws_the_request_and_cleanup_releases_storage(
    catalog: Catalog, root: str
) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    running(catalog)
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1)
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root, mode="control_result",
                                          request_id=request.id, generation=1, poll_interval=0.05)
    collect(trigger.on_kill())
    result = channel.result(request.id)
    assert result.state == "expired" and "marked failed or cleared" in (result.error or "")
    closed: list[bool] = []
    assert trigger._catalog_cache is not None
    trigger._catalog_cache.storage.close = lambda: closed.append(True)  # type: ignore[attr-defined]
    collect(trigger.cleanup())
    assert closed == [True] and trigger._catalog_cache is None


def test_trigger_reads_its_connection_with_the_async_api(
    catalog: Catalog, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No synchronous connection lookup inside the triggerer's event loop."""
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    monkeypatch.setenv("AIRFLOW_CONN_SP_ASYNC", json.dumps({"conn_type": "sparkpoint", "host": root}))

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the synchronous connection API was used")

    monkeypatch.setattr(SparkpointHook, "get_connection", classmethod(forbidden))
    running(catalog, state="failed", error="boom")
    trigger = SparkpointCheckpointTrigger(job_name=JOB, sparkpoint_conn_id="sp_async", poll_interval=0.05)

    async def first_event() -> Any:
        async for event in trigger.run():
            return event
        return None

    event = collect(first_event())
    assert event.payload["status"] == "error" and "failed: boom" in event.payload["message"]
