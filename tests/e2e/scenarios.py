"""Scenarios shared by the local and the cluster end-to-end modules."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tests.e2e.procs import driver_processes, kill, wait_gone
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import Totals, running_with_checkpoint
from tests.support.waits import wait_for


def driver_sigkill_then_retry(api: AirflowApi, stack: AirflowStack, tmp_path: Path,
                              dag: str) -> dict[str, Any]:
    """The first try pauses while staging batch 2 (batches 0 and 1 are checkpointed); the
    test SIGKILLs its driver (the spark-submit JVM, the Python driver and its workers) from
    outside; Airflow's retry must resume after batch 1 and the output must be exact.
    Returns the retry's run result."""
    pipeline = Totals(tmp_path, f"killed_driver_{dag}")
    pipeline.write_many(5)
    run = api.trigger(dag, pipeline.params(pause_at="stage:2"))

    def describe() -> str:
        return api.describe(dag, run)

    paused = wait_for("the first try to pause in batch 2", lambda: pipeline.reached("stage"), 900,
                      describe)
    generation = wait_for("the checkpoint of batch 1", lambda: running_with_checkpoint(pipeline, 1), 120,
                          describe)
    latest = pipeline.catalog.latest()
    assert latest is not None and latest.batch_id == 1, latest

    drivers = driver_processes(pipeline.job, stack.token)
    assert paused["pid"] in {p.pid for p in drivers}, f"the paused driver {paused} is not among {drivers}"
    assert any("SparkSubmit" in p.cmdline for p in drivers), drivers
    killed = kill(drivers, signal.SIGKILL)
    assert wait_gone(killed, timeout=60) == [], "the SIGKILLed driver is still running"

    ti = api.wait_task(dag, run, "job", {"success"}, timeout=900)
    tries = api.tries(dag, run, "job")
    assert ti["try_number"] == 2 and tries[-1]["state"] == "success", tries
    assert tries[0]["state"] in ("failed", "up_for_retry"), tries
    first_log = api.log(dag, run, "job", 1)
    assert "Error code is: -9" in first_log or "Error code is: 137" in first_log, first_log[-3000:]

    result: dict[str, Any] = api.xcom(dag, run, "job")
    assert result["status"] == "finished" and result["generation"] == generation + 1, result
    assert result["first_batch"] == latest.batch_id + 1, f"the retry did not resume after batch 1: {result}"
    assert result["restore_mode"] in ("in-place", "snapshot"), result
    assert result["last_batch"] == 4, result
    assert "resuming job" in api.log(dag, run, "job", 2)
    pipeline.assert_exact()
    return result
