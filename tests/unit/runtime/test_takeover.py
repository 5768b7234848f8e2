"""The start rule (`runtime.takeover.check_start`): a live run another task instance (or
no task) started is never fenced silently; a retry or a clear of the same task instance,
a dead run and an explicit takeover go ahead."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history_records import AirflowTry, generation_details
from airflow_sparkpoint.exceptions import JobAlreadyRunning
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.takeover import LIVE_HEARTBEAT_AGE_S, check_start
from airflow_sparkpoint.storage import open_storage
from tests.support.records import write_status

RUNNING = AirflowTry("etl", "run_orders", "scheduled__2026-11-01", 1)


def start(catalog: Catalog, starter: AirflowTry | None, *, heartbeat_age: float = 1.0,
          host: str | None = None, pid: int | None = None, state: str = "running") -> int:
    """Claim a generation as a driver started by `starter` would, and write its status."""
    env = {} if starter is None else {
        "AIRFLOW_CTX_DAG_ID": starter.dag_id, "AIRFLOW_CTX_TASK_ID": starter.task_id,
        "AIRFLOW_CTX_DAG_RUN_ID": starter.run_id, "AIRFLOW_CTX_TRY_NUMBER": str(starter.try_number),
        **({"SPARKPOINT_AIRFLOW_MAP_INDEX": str(starter.map_index)} if starter.map_index is not None else {})}
    generation = catalog.claim_generation(generation_details(environ=env)).generation
    write_status(catalog, state, generation=generation, heartbeat_age=heartbeat_age,
                 host=host or socket.gethostname(), pid=os.getpid() if pid is None else pid)
    return generation


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(open_storage(str(tmp_path / "sp")), "orders")


@pytest.mark.parametrize("starter", [
    None,  # a manual or CLI start
    AirflowTry("etl", "run_orders", "manual__2026-11-02", 1),  # a manual trigger / backfill of the same DAG
    AirflowTry("other_dag", "run_orders", "scheduled__2026-11-01", 1),  # a second DAG, same job name
    AirflowTry("etl", "other_task", "scheduled__2026-11-01", 1),
    AirflowTry("etl", "run_orders", "scheduled__2026-11-01", 1, map_index=2),  # another mapped instance
])
def test_another_tasks_start_is_refused_naming_the_running_one(
    catalog: Catalog, starter: AirflowTry | None
) -> None:
    generation = start(catalog, RUNNING, heartbeat_age=4)
    with pytest.raises(JobAlreadyRunning) as info:
        check_start(catalog, starter, takeover=False)
    message = str(info.value)
    for part in (f"generation {generation}", "etl.run_orders try 1", "scheduled__2026-11-01",
                 socket.gethostname(), f"pid {os.getpid()}", "heartbeat 4 s ago", "takeover=True"):
        assert part in message, (part, message)
    assert catalog.current_generation() == generation  # nothing was claimed


def test_a_manual_run_blocks_an_airflow_start(catalog: Catalog) -> None:
    start(catalog, None)
    with pytest.raises(JobAlreadyRunning, match="no Airflow task"):
        check_start(catalog, RUNNING, takeover=False)


@pytest.mark.parametrize("starter", [
    AirflowTry("etl", "run_orders", "scheduled__2026-11-01", 2),  # a retry
    AirflowTry("etl", "run_orders", "scheduled__2026-11-01", 5),  # a clear (try number goes on)
])
def test_a_retry_or_clear_of_the_same_task_takes_over(catalog: Catalog, starter: AirflowTry) -> None:
    start(catalog, RUNNING)
    check_start(catalog, starter, takeover=False)


def test_takeover_true_goes_ahead(catalog: Catalog) -> None:
    start(catalog, RUNNING)
    check_start(catalog, None, takeover=True)
    assert SparkpointConfig.from_conf({"dir": "/x", "job": "j", "spark.sparkpoint.takeover": "true"}).takeover
    assert not SparkpointConfig.from_conf({"dir": "/x", "job": "j"}).takeover


def test_a_dead_run_does_not_block(catalog: Catalog) -> None:
    start(catalog, RUNNING, heartbeat_age=LIVE_HEARTBEAT_AGE_S + 5)  # stale heartbeat
    check_start(catalog, None, takeover=False)
    start(catalog, RUNNING, state="failed")  # ended
    check_start(catalog, None, takeover=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start(catalog, RUNNING, pid=gone.pid)  # fresh heartbeat, but its driver here is gone (SIGKILL)
    check_start(catalog, None, takeover=False)


def test_a_live_run_on_another_host_blocks(catalog: Catalog) -> None:
    start(catalog, RUNNING, host="worker-7.example", pid=1)
    with pytest.raises(JobAlreadyRunning, match="worker-7.example"):
        check_start(catalog, None, takeover=False)


def test_the_airflow_try_round_trips_with_its_map_index() -> None:
    task = AirflowTry("etl", "run", "r1", 3, map_index=0)
    assert AirflowTry.from_json({"dag_id": "etl", "task_id": "run", "run_id": "r1", "try_number": "3",
                                 "map_index": "0"}) == task
    assert task.same_task(AirflowTry("etl", "run", "r1", 4, map_index=0))
    assert not task.same_task(AirflowTry("etl", "run", "r1", 4))


def test_a_run_whose_stop_completed_does_not_block(catalog: Catalog) -> None:
    """A stop-with-savepoint completes its request before it writes its final status:
    the next deploy step (blue-green's green) starts at once, as before."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    generation = start(catalog, RUNNING)
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=generation, timeout_s=60)
    channel.acknowledge(request, generation)
    with pytest.raises(JobAlreadyRunning):  # acknowledged, still taking its savepoint
        check_start(catalog, None, takeover=False)
    channel.complete(request, generation=generation,
                     savepoint=f"{catalog.uri}/savepoints/savepoint-1-0a1b2c3d", batch_id=3)
    check_start(catalog, None, takeover=False)
    # a plain savepoint does not end it
    other = channel.submit("savepoint", generation=generation, timeout_s=60)
    channel.acknowledge(other, generation)
    channel.complete(other, generation=generation, savepoint=f"{catalog.uri}/savepoints/savepoint-2-0a1b2c3d",
                     batch_id=3)
    generation = start(catalog, RUNNING)
    with pytest.raises(JobAlreadyRunning):
        check_start(catalog, None, takeover=False)


def test_a_claim_from_before_map_indexes_were_recorded_matches_any_index() -> None:
    """A driver of the previous release recorded no map index: a retry of its mapped task
    after the upgrade is still the same task (it was refused as another one)."""
    retry = AirflowTry("etl", "run", "r1", 2, map_index=3)
    old_claim = AirflowTry.from_json({"dag_id": "etl", "task_id": "run", "run_id": "r1", "try_number": "1"})
    assert retry.same_task(old_claim)
    assert not retry.same_task(AirflowTry.from_json(
        {"dag_id": "etl", "task_id": "run", "run_id": "r1", "try_number": "1", "map_index": "2"}))
    assert not retry.same_task(AirflowTry.from_json({"dag_id": "etl", "task_id": "run", "run_id": "r2"}))


def test_a_killed_driver_not_yet_reaped_counts_as_gone() -> None:
    """A SIGKILLed driver stays a zombie until its parent (or an init that reaps late)
    collects it: it runs nothing, so it must not block the next start of its job."""
    import os
    import signal
    import subprocess
    import time

    from airflow_sparkpoint.runtime.livedir import process_alive

    child = subprocess.Popen(["sleep", "60"])
    try:
        assert process_alive(child.pid, None)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.time() + 10  # not reaped: no wait() until the end
        stat = Path(f"/proc/{child.pid}/stat")
        while time.time() < deadline and stat.read_text().split(") ")[1][0] != "Z":
            time.sleep(0.05)
        assert not process_alive(child.pid, None), "a zombie was taken for a running driver"
    finally:
        child.kill()
        child.wait()
