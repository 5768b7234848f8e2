"""A deferrable submit on the real Airflow stack (issue #50's headline): a streaming job
runs deferred (its driver detached, `SparkpointRunTrigger` in the triggerer); the
scheduler and the triggerer are killed with SIGKILL and started again while input keeps
arriving; the driver keeps committing (the same generation, every batch once, totals
exact against the oracle from the input); the new triggerer takes the trigger over and
the task stays deferred. Then a mark-failed of the task stops the driver within 30 s:
the trigger's `on_kill` wrote a cancel to the generation and the process group is gone.

Figures printed: the longest gap between commits (the Delta history's) while Airflow
restarted, and in the seconds before it.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import delta_history
from airflow_sparkpoint.services.detached import group_exists
from tests.e2e.procs import read
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import Totals, running_with_checkpoint
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAG = "e2e_deferred"
TRIGGER = "airflow_sparkpoint.triggers.run.SparkpointRunTrigger"


def trigger_logs(stack: AirflowStack, run_id: str) -> dict[int, str]:
    """The trigger's log of each triggerer that ran it, by triggerer job id."""
    folder = stack.home / "logs" / f"dag_id={DAG}" / f"run_id={run_id}" / "task_id=job"
    return {int(p.name.split(".")[-2]): p.read_text(errors="replace")
            for p in folder.glob("attempt=1.log.trigger.*.log")}


def trigger_starts(stack: AirflowStack, run_id: str) -> list[int]:
    return sorted(job for job, text in trigger_logs(stack, run_id).items() if ") starting" in text)


def commit_times(pipeline: Totals) -> list[tuple[float, int]]:
    """(wall-clock second, batch) of each Sparkpoint commit in the table's Delta history,
    oldest first: when each batch became visible, not when a status record said so (the
    status is written at the heartbeat's pace, which would quantize the gaps)."""
    return sorted((entry["timestamp"] / 1000.0, int(entry["batch"]))
                  for entry in delta_history(pipeline.output) if entry["batch"] is not None)


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))


@dataclass(frozen=True)
class DeferredStart:
    """A submit task of `DAG` deferred on its running job: the DAG run, the generation,
    the task instance as it deferred, the driver's process group."""

    run: str
    generation: int
    ti: dict[str, Any]
    pgid: int


def start_deferred(airflow_api: AirflowApi, pipeline: Totals, *, files: int, batch: int,
                   try_number: int | None = None) -> DeferredStart:
    """Write `files` input files, trigger `DAG` and wait until its job runs with a
    checkpoint of `batch` and its task (at `try_number`, if given) has deferred on it."""
    pipeline.write_many(files)
    run = airflow_api.trigger(DAG, pipeline.params(trigger="processingTime:1s"))
    generation = wait_for(f"the deferred job's checkpoint of batch {batch}",
                          lambda: running_with_checkpoint(pipeline, batch), 600,
                          lambda: airflow_api.describe(DAG, run))
    ti = airflow_api.wait_task(DAG, run, "job", {"deferred"}, timeout=300, try_number=try_number)
    return DeferredStart(run, generation, ti, os.getpgid(int(pipeline.status()["pid"])))


def test_a_deferred_job_survives_an_airflow_restart_and_a_mark_failed_stops_it(
        airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path, airflow_home: Path) -> None:
    pipeline = Totals(tmp_path, "deferred")
    started = start_deferred(airflow_api, pipeline, files=2, batch=1)
    run, generation, ti, pgid = started.run, started.generation, started.ti, started.pgid
    assert ti["trigger"] and ti["trigger"]["classpath"] == TRIGGER, ti
    driver_pid = int(pipeline.status()["pid"])
    scheduler = read(airflow_stack.procs["scheduler"].pid)
    assert scheduler is not None and pgid not in (scheduler.pgid, airflow_stack.procs["triggerer"].pid)

    # Input keeps arriving (one micro-batch a trigger interval, 1 s) while Airflow restarts.
    writing = threading.Event()

    def feed() -> None:
        while not writing.wait(1.0):
            pipeline.write_many(1)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        time.sleep(8)
        restart_at = time.time()
        airflow_stack.restart_component("scheduler", signal.SIGKILL)
        airflow_stack.restart_component("triggerer", signal.SIGKILL)
        airflow_stack.wait_healthy(timeout=180)
        first = trigger_starts(airflow_stack, run)
        wait_for("the new triggerer to take the trigger over",
                 lambda: len(trigger_starts(airflow_stack, run)) > len(first) or None, 180,
                 airflow_stack.tails)
        restarted_in = time.time() - restart_at
        time.sleep(4)  # the new triggerer follows the run while it commits on
    finally:
        writing.set()
        feeder.join(5)
    last = len(pipeline.files) - 1
    wait_for(f"the driver to commit batch {last}", lambda: (pipeline.committed() or -1) >= last or None, 180)
    commits = commit_times(pipeline)
    before = longest_gap([t for t, _ in commits if restart_at - 6 <= t <= restart_at])
    gap = longest_gap([t for t, _ in commits if restart_at <= t <= restart_at + restarted_in + 2])
    batches_during = [b for t, b in commits if restart_at <= t <= restart_at + restarted_in]
    print(f"Airflow killed; the new triggerer followed the run again {restarted_in:.1f} s later; batches "
          f"committed meanwhile: {batches_during}; longest gap between commits (Delta history) from the "
          f"restart on: {gap:.2f} s, in the 6 s before it: {before:.2f} s (trigger 1 s, input every 1 s)")

    assert os.getpgid(driver_pid) == pgid, "the driver was restarted"
    assert pipeline.catalog.current_generation() == generation, "a new generation was started"
    assert int(pipeline.status()["generation"]) == generation
    assert airflow_api.task_instance(DAG, run, "job")["state"] == "deferred"
    assert batches_during, "no batch was committed while Airflow restarted"
    pipeline.assert_exact()

    # Mark failed: the trigger's on_kill cancels the run and kills its process group.
    marked_at = time.monotonic()
    airflow_api.mark(DAG, run, "job", "failed")
    wait_for("the driver to end", lambda: not group_exists(pgid) or None, 60, airflow_stack.tails)
    stopped_in = time.monotonic() - marked_at
    print(f"mark-failed to the driver's process group gone: {stopped_in:.1f} s")
    assert stopped_in <= 30, stopped_in
    channel = ControlChannel(pipeline.catalog)
    requests = [channel.read_request(i) for i in channel.request_ids()]
    assert [(r.kind, r.generation) for r in requests] == [("cancel", generation)], requests
    assert "SparkpointRunTrigger" in requests[0].requested_by
    logs = "".join(trigger_logs(airflow_stack, run).values())
    # 3.3+ calls the trigger's on_kill; 3.2 only its cleanup, which does the same (imported
    # here, after `airflow_home` set this process's Airflow settings: Airflow reads them once,
    # at its first import, and the in-process tests after this one need that home)
    from airflow_sparkpoint.triggers.run import NATIVE_ON_KILL

    assert "task job is failed" in logs and ("invoking on_kill" in logs) == NATIVE_ON_KILL, logs[-3000:]
    assert airflow_api.task_instance(DAG, run, "job")["state"] == "failed"
    pipeline.assert_exact()


@pytest.mark.slow
def test_a_deferred_job_stopped_with_a_savepoint_ends_its_task_with_the_run_result(
        airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path) -> None:
    """`SparkpointSavepointOperator(stop=True)` (another DAG) stops the detached driver
    between micro-batches with a savepoint; the trigger sees the run end and the deferred
    submit task succeeds with the run result (``status: stopped``, the savepoint), output exact."""
    pipeline = Totals(tmp_path, "deferred_stop")
    started = start_deferred(airflow_api, pipeline, files=3, batch=2)
    run, generation, pgid = started.run, started.generation, started.pgid

    stop = airflow_api.trigger("e2e_stop", {"job_name": pipeline.job, "checkpoint_dir": str(pipeline.root)})
    airflow_api.wait_task("e2e_stop", stop, "stop", {"success"}, timeout=300)
    airflow_api.wait_task(DAG, run, "job", {"success"}, timeout=120)
    result = airflow_api.xcom(DAG, run, "job")
    assert (result["status"] == "stopped" and result["generation"] == generation
            and result["last_batch"] == 2), result
    assert result["savepoint"], result
    assert airflow_api.xcom(DAG, run, "job", key="generation") == generation
    assert [t["state"] for t in airflow_api.tries(DAG, run, "job")] == ["success"]
    wait_for("the driver's process group to end", lambda: not group_exists(pgid) or None, 60)
    pipeline.assert_exact()


@pytest.mark.slow
def test_a_dag_run_marked_failed_stops_its_deferred_driver(
        airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path) -> None:
    """The DAG run's "Mark run as failed" (a DAG-run stop) fails its deferred submit task;
    the trigger is dropped as a user action, and the driver's process group is gone within
    30 s, with a cancel to its generation; output exact."""
    pipeline = Totals(tmp_path, "deferred_run_failed")
    started = start_deferred(airflow_api, pipeline, files=2, batch=1)
    run, generation, pgid = started.run, started.generation, started.pgid

    marked_at = time.monotonic()
    airflow_api.mark_run(DAG, run, "failed")
    wait_for("the driver to end", lambda: not group_exists(pgid) or None, 60, airflow_stack.tails)
    stopped_in = time.monotonic() - marked_at
    print(f"DAG run marked failed to the driver's process group gone: {stopped_in:.1f} s")
    assert stopped_in <= 30, stopped_in
    channel = ControlChannel(pipeline.catalog)
    requests = [channel.read_request(i) for i in channel.request_ids()]
    assert [(r.kind, r.generation) for r in requests] == [("cancel", generation)], requests
    assert airflow_api.task_instance(DAG, run, "job")["state"] != "deferred"
    pipeline.assert_exact()


@pytest.mark.slow
def test_a_clear_of_a_deferred_task_restarts_its_job_in_a_new_generation(
        airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path) -> None:
    """A clear of the deferred task does what it does to an attached task: the old try's
    trigger cancels the run and its process group is killed, and the new try starts the
    job again (restore latest, a new generation) and defers on it, whichever came first,
    its look at the catalog or the cancel; the new generation commits on, output exact.

    Figures printed: the clear to the old process group gone, to the new generation's
    first commit; which ordering the new try met (its task log)."""
    pipeline = Totals(tmp_path, "deferred_clear")
    started = start_deferred(airflow_api, pipeline, files=2, batch=1, try_number=1)
    run, first, pgid = started.run, started.generation, started.pgid
    describe = lambda: airflow_api.describe(DAG, run)

    cleared_at, cleared_wall = time.monotonic(), time.time()
    airflow_api.clear(DAG, run, ["job"])
    wait_for("the old driver's process group to end", lambda: not group_exists(pgid) or None, 120,
             airflow_stack.tails)
    gone_in = time.monotonic() - cleared_at
    pipeline.write_many(1)  # batch 2: for the new generation
    second = wait_for("a new generation to commit batch 2",
                      lambda: running_with_checkpoint(pipeline, 2, after_generation=first), 600, describe)
    committed_in = time.monotonic() - cleared_at
    ti = airflow_api.wait_task(DAG, run, "job", {"deferred"}, timeout=300, try_number=2)
    assert ti["trigger"] and ti["trigger"]["classpath"] == TRIGGER, ti
    log = airflow_api.log(DAG, run, "job", 2)
    ordering = ("re-attached, then restarted when the old trigger's cancel ended the run"
                if "cancelled by the trigger of the cleared earlier try" in log
                else "stopped the run try 1 had deferred on, then started anew"
                if "the task was cleared" in log
                else "waited for the run the old trigger's cancel was ending"
                if "before starting a new generation" in log
                else "started anew (the run had ended)")
    claimed_in = pipeline.catalog.generation_claim(second).started_at - cleared_wall
    print(f"clear: the old process group gone in {gone_in:.1f} s; the new generation {second} claimed "
          f"{claimed_in:.1f} s and committed its first batch {committed_in:.1f} s after the clear; "
          f"try 2 {ordering}")
    assert gone_in <= 30, gone_in
    assert second > first

    # The new generation keeps committing.
    pipeline.write_many(2)
    last = len(pipeline.files) - 1
    wait_for(f"generation {second} to commit batch {last}",
             lambda: running_with_checkpoint(pipeline, last, after_generation=first) == second or None, 300,
             describe)
    # its commit follows the checkpoint that confirms it
    wait_for(f"batch {last} in the table", lambda: (pipeline.committed() or -1) >= last or None, 120,
             describe)
    assert airflow_api.xcom(DAG, run, "job", key="generation") == second
    channel = ControlChannel(pipeline.catalog)
    requests = [channel.read_request(i) for i in channel.request_ids()]
    # one cancel, or two when the old trigger and the new try both stopped it; none to the new run
    assert requests and {(r.kind, r.generation) for r in requests} == {("cancel", first)}, requests
    assert all(r.requested_by.endswith(", try 1") for r in requests), requests
    pipeline.assert_exact()

    new_pgid = os.getpgid(int(pipeline.status()["pid"]))
    airflow_api.mark(DAG, run, "job", "failed")
    wait_for("the new driver to end", lambda: not group_exists(new_pgid) or None, 60, airflow_stack.tails)
    pipeline.assert_exact()
