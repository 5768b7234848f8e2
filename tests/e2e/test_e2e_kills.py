"""Kills under a real Airflow (api-server, scheduler with LocalExecutor, dag-processor,
triggerer as separate processes) with real ``spark-submit`` drivers on ``local[2]``.

* the driver of a running try is SIGKILLed from outside: Airflow's retry resumes from
  the latest retained checkpoint and the output is exact;
* a running streaming task is marked failed through the REST API: the task supervisor
  SIGTERMs the task's process group (SIGKILL 5 s later); no driver survives, nothing is
  lost or duplicated, and the next run, started at once, processes all remaining input.

Each test proves its fault happened: the pause point was reached, the pids it killed
(or the supervisor killed) are gone, the task instance's state and tries say so.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.e2e.procs import driver_processes, kill, wait_gone
from tests.e2e.stack import AirflowApi, AirflowStack, wait_for
from tests.e2e.support import Totals, running_with_checkpoint, subset

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def test_retry_after_the_driver_is_sigkilled_resumes_from_the_latest_checkpoint(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    dag = "e2e_submit"
    pipeline = Totals(tmp_path, "killed_driver")
    pipeline.write_many(5)
    # The first try pauses while staging batch 2 (batches 0 and 1 are checkpointed).
    run = airflow_api.trigger(dag, pipeline.params(pause_at="e2e.stage:2"))
    describe = lambda: airflow_api.describe(dag, run)  # noqa: E731
    paused = wait_for("the first try to pause in batch 2", lambda: pipeline.reached("e2e.stage"), 600, describe)
    generation = wait_for("the checkpoint of batch 1", lambda: running_with_checkpoint(pipeline, 1), 120, describe)
    latest = pipeline.catalog.latest()
    assert latest is not None and latest.batch_id == 1, latest

    drivers = driver_processes(pipeline.job, airflow_stack.token)
    assert paused["pid"] in {p.pid for p in drivers}, f"the paused driver {paused} is not among {drivers}"
    assert any("SparkSubmit" in p.cmdline for p in drivers), drivers
    killed = kill(drivers, signal.SIGKILL)
    assert wait_gone(killed, timeout=60) == [], "the SIGKILLed driver is still running"

    ti = airflow_api.wait_task(dag, run, "job", {"success"}, timeout=900)
    tries = airflow_api.tries(dag, run, "job")
    assert ti["try_number"] == 2 and [t["state"] for t in tries][-1] == "success", tries
    assert tries[0]["state"] in ("failed", "up_for_retry"), tries
    first_log = airflow_api.log(dag, run, "job", 1)
    assert "Error code is: -9" in first_log or "Error code is: 137" in first_log, first_log[-3000:]

    result = airflow_api.xcom(dag, run, "job")
    assert result["status"] == "finished" and result["generation"] == generation + 1, result
    assert result["first_batch"] == latest.batch_id + 1, f"the retry did not resume after batch 1: {result}"
    assert result["restore_mode"] in ("in-place", "snapshot"), result
    assert result["last_batch"] == 4, result
    assert "resuming job" in airflow_api.log(dag, run, "job", 2)
    pipeline.assert_exact()


def test_task_marked_failed_leaves_no_driver_and_the_next_run_resumes(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    dag = "e2e_stream"
    pipeline = Totals(tmp_path, "marked_failed")
    pipeline.write_many(2)
    run = airflow_api.trigger(dag, pipeline.params(trigger="processingTime:1s"))
    describe = lambda: airflow_api.describe(dag, run)  # noqa: E731
    generation = wait_for("the streaming job to checkpoint batch 1",
                          lambda: running_with_checkpoint(pipeline, 1), 600, describe)
    running = airflow_api.wait_task(dag, run, "job", {"running"}, timeout=60)
    drivers = driver_processes(pipeline.job, airflow_stack.token)
    assert any("SparkSubmit" in p.cmdline for p in drivers) and pipeline.status()["pid"] in {
        p.pid for p in drivers}, drivers

    marked = airflow_api.mark(dag, run, "job", "failed")
    assert [t["state"] for t in marked] == ["failed"], marked
    t0 = time.monotonic()
    # The supervisor notices at its next heartbeat (<= 5 s), SIGTERMs the task's process
    # group and SIGKILLs it 5 s later: every driver process and the task process go.
    left = wait_gone(drivers, timeout=120)
    assert left == [], f"driver processes survived the supervisor's kill: {left}"
    stopped_after = time.monotonic() - t0
    assert wait_for("the task process to exit", lambda: not _alive(running["pid"]), 60)
    log = airflow_api.log(dag, run, "job", 1)
    assert "Server indicated the task shouldn't be running anymore" in log, log[-3000:]
    assert airflow_api.task_instance(dag, run, "job")["state"] == "failed"
    # Whatever was committed when the kill landed is a prefix of the input, exactly.
    committed = pipeline.table()
    assert any(committed == pipeline.expected(files) for files in range(len(pipeline.files) + 1)), committed

    # More input, and the next run of the same job at once (well within the 60 s the
    # killed task's stop request, if any, stays open).
    pipeline.write_many(3)
    next_run = airflow_api.trigger(dag, pipeline.params(trigger="availableNow"))
    airflow_api.wait_task(dag, next_run, "job", {"success"}, timeout=900)
    result = airflow_api.xcom(dag, next_run, "job")
    print(f"drivers gone {stopped_after:.1f} s after the mark; next run: "
          f"{subset(result, 'status', 'generation', 'first_batch', 'last_batch', 'batches_processed')}")
    assert result["generation"] > generation, result
    assert result["status"] == "finished", (
        f"the next run did not process the remaining input: {result} (a stop request filed for the "
        "killed generation was served by its successor)")
    assert result["last_batch"] == 4 and result["batches_processed"] >= 3, result
    assert result["first_batch"] is not None and result["first_batch"] >= 2, result
    pipeline.assert_exact()


def _alive(pid: int) -> bool:
    from tests.e2e.procs import read

    return read(pid) is not None
