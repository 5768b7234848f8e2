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

import time
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import delta_commits, orphaned_staged_files
from tests.e2e.procs import driver_processes, read, wait_gone
from tests.e2e.scenarios import driver_sigkill_then_retry
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import Totals, running_with_checkpoint, subset
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def test_retry_after_the_driver_is_sigkilled_resumes_from_the_latest_checkpoint(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    driver_sigkill_then_retry(airflow_api, airflow_stack, tmp_path, "e2e_submit")


def test_task_marked_failed_leaves_no_driver_and_the_next_run_resumes(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    dag = "e2e_stream"
    pipeline = Totals(tmp_path, "marked_failed")
    pipeline.write_many(2)
    run = airflow_api.trigger(dag, pipeline.params(trigger="processingTime:1s"))
    describe = lambda: airflow_api.describe(dag, run)
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
    signals = wait_for(f"the supervisor to report how task pid {running['pid']} ended",
                       lambda: supervisor_signals(airflow_stack, running["pid"]), 60)
    assert signals[0] == "SIGTERM", f"the supervisor sent {signals} to task pid {running['pid']}"
    assert airflow_api.task_instance(dag, run, "job")["state"] == "failed"
    # Nothing left in the control channel that a later generation would act on: a request
    # filed for the killed generation must name it (or be withdrawn).
    stale = ControlChannel(pipeline.catalog).pending(generation=generation + 1)
    # Whatever was committed when the kill landed is a prefix of the input, exactly.
    committed = pipeline.table()
    assert any(committed == pipeline.expected(files) for files in range(len(pipeline.files) + 1)), committed

    # More input, and the next run of the same job at once (within the minute a stop
    # request of the killed task's on_kill would stay open, when the machine is not loaded).
    pipeline.write_many(3)
    next_run = airflow_api.trigger(dag, pipeline.params(trigger="availableNow"))
    airflow_api.wait_task(dag, next_run, "job", {"success"}, timeout=900)
    result = airflow_api.xcom(dag, next_run, "job")
    print(f"drivers gone {stopped_after:.1f} s after the mark (supervisor sent {signals}); next run done "
          f"{time.monotonic() - t0:.0f} s after the mark: "
          f"{subset(result, 'status', 'generation', 'first_batch', 'last_batch', 'batches_processed')}")
    assert result["generation"] > generation, result
    assert result["status"] == "finished", (
        f"the next run did not process the remaining input: {result}; requests left pending by the "
        f"killed try: {stale}")
    assert result["last_batch"] == 4 and result["batches_processed"] >= 3, result
    assert result["first_batch"] is not None and result["first_batch"] >= 2, result
    pipeline.assert_exact()
    assert stale == [], f"control requests a successor of generation {generation} would serve: {stale}"


def _alive(pid: int) -> bool:
    return read(pid) is not None


def supervisor_signals(stack: AirflowStack, pid: int) -> list[str]:
    """The signals the task supervisor (in the scheduler's LocalExecutor workers) reports
    sending to task process `pid`, in order: from its "Process exited" and "did not
    terminate in time" lines."""
    text = stack.log_paths["scheduler"].read_text(errors="replace")
    sent = []
    for line in text.splitlines():
        if f"pid={pid}" not in line:
            continue
        for token in line.split():
            if token.startswith(("signal_sent=", "signal=")):
                sent.append(token.split("=", 1)[1])
    return sent


def test_two_overlapping_tries_of_a_cleared_task_stay_exactly_once(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    """A streaming task is cleared while its driver is in the middle of a batch, and that
    driver outlives the task (``e2e_detached``: its own session, as a cluster-mode
    driver): the second try runs while the first try's driver still holds staged output.
    The first try's driver is then let go on: as a superseded generation it must neither
    commit nor disturb the second try; the output stays exact."""
    dag = "e2e_detached"
    pipeline = Totals(tmp_path, "overlap")
    pipeline.write_many(3)
    run = airflow_api.trigger(dag, pipeline.params(trigger="processingTime:1s", pause_at="stage:3"))
    describe = lambda: airflow_api.describe(dag, run)
    first = wait_for("try 1 to checkpoint batch 2", lambda: running_with_checkpoint(pipeline, 2), 600,
                     describe)
    try1 = airflow_api.wait_task(dag, run, "job", {"running"}, timeout=60, try_number=1)
    pipeline.write_many(1)  # batch 3: try 1 pauses while staging it
    paused = wait_for("try 1 to pause in batch 3", lambda: pipeline.reached("stage"), 300, describe)
    assert paused["generation"] == first, paused
    old_drivers = driver_processes(pipeline.job, airflow_stack.token)
    assert paused["pid"] in {p.pid for p in old_drivers}, (paused, old_drivers)
    task_group = read(try1["pid"])
    assert task_group is not None and all(p.pgid != task_group.pgid for p in old_drivers), (
        "the detached driver must not be in the task's process group")

    airflow_api.clear(dag, run, ["job"])
    # Try 1's task process dies (the supervisor's group kill); its driver does not.
    assert wait_for("try 1's task process to exit", lambda: read(try1["pid"]) is None, 120)
    # The killed try leaves nothing in the control channel for its successor to act on.
    stale = ControlChannel(pipeline.catalog).pending(generation=first + 1)
    assert stale == [], f"control requests the next try would serve: {stale}"
    airflow_api.wait_task(dag, run, "job", {"running"}, timeout=600, try_number=2)
    second = wait_for("try 2 to start a new generation", lambda: _running_generation(pipeline, first), 600,
                      describe)
    assert all(p.alive() for p in old_drivers), "try 1's driver died: the tries did not overlap"
    pipeline.write_many(1)  # batch 4, for try 2
    wait_for("try 2 to checkpoint batch 4",
             lambda: running_with_checkpoint(pipeline, 4, after_generation=first), 600, describe)
    assert all(p.alive() for p in old_drivers), "try 1's driver died before it was released"

    # Let try 1's driver go on with batch 3 as a superseded generation.
    pipeline.release("stage")
    left = wait_gone(old_drivers, timeout=300)
    assert left == [], f"try 1's superseded driver kept running: {left}"
    pipeline.write_many(1)  # batch 5: try 2 is still the one running
    wait_for("try 2 to checkpoint batch 5",
             lambda: running_with_checkpoint(pipeline, 5, after_generation=first), 600, describe)

    ControlChannel(pipeline.catalog).submit("stop", timeout_s=300, generation=second, requested_by="e2e test")
    airflow_api.wait_task(dag, run, "job", {"success"}, timeout=300, try_number=2)
    result = airflow_api.xcom(dag, run, "job")
    assert result["status"] == "stopped" and result["generation"] == second, result

    # Readers see every input row exactly once, and no batch was committed by the
    # superseded generation or twice.
    got, want = pipeline.table(), pipeline.expected()
    assert got == want, f"table {got}\nexpected {want}"
    commits = delta_commits(pipeline.output)
    assert sorted(c["batch"] for c in commits) == list(range(6)), commits
    late = [c for c in commits if c["generation"] == first and c["batch"] >= 3]
    assert not late, f"the superseded generation {first} committed: {late}"
    # How the superseded driver ended, and what it left: it must have been fenced as a
    # superseded generation, must not have run in try 2's live checkpoint directory, and
    # must not leave staged output or pending transactions behind.
    zombie = detached_log(airflow_stack, "paused at stage:3", f"spark.sparkpoint.job={pipeline.job}")
    problems = []
    if "superseded" not in zombie:
        problems.append("the first try's driver did not end as a superseded generation")
    if "CONCURRENT_STREAM_LOG_UPDATE" in zombie or "Multiple streaming jobs detected" in zombie:
        problems.append("the two tries' drivers shared one live Spark checkpoint directory "
                        "(Spark: CONCURRENT_STREAM_LOG_UPDATE)")
    stale_txns = [f"batch {t.batch_id} generation {t.generation}" for t in pipeline.catalog.transactions()]
    if stale_txns:
        problems.append(f"transactions left pending: {stale_txns}")
    orphans = orphaned_staged_files(pipeline.output, pipeline.job)
    if orphans:
        problems.append("staged output left behind: "
                        f"{[str(Path(o).relative_to(pipeline.output)) for o in orphans]}")
    assert not problems, "; ".join(problems)


def detached_log(stack: AirflowStack, *needles: str) -> str:
    """The output of the detached driver whose log contains every needle."""
    logs = sorted((stack.home / "e2e-logs").glob("detached-driver-*.log"))
    found = [p.read_text(errors="replace") for p in logs]
    found = [text for text in found if all(n in text for n in needles)]
    assert len(found) == 1, f"{len(found)} detached driver logs contain {needles}"
    return found[0]


def _running_generation(pipeline: Totals, after: int) -> int | None:
    status = pipeline.status()
    generation = int(status.get("generation") or 0)
    return generation if status.get("state") == "running" and generation > after else None
