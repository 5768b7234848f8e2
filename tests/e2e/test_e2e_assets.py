"""Committed data as asset events under a real Airflow: ``e2e_on_commits`` is scheduled on
the Delta table of a streaming job through an `AssetWatcher` whose
`SparkpointCommitTrigger` runs in the ``airflow triggerer`` process. It runs after each
commit, and never for a batch that was staged and recorded but then aborted: the driver
is held after recording batch 1 and its task is marked failed (the supervisor kills it);
the next run aborts that transaction at restore and commits batch 1 again as its own.

A second job, ``e2e_deployed``, goes through a SIGKILLed driver and its retry, a
savepoint killed half-copied, and a blue-green deploy (the example DAG) whose green is
rolled back: ``e2e_on_deployed_commits`` hears of every commit once and of no staged or
aborted batch, and ``e2e_deploy_on_savepoint`` runs once, for the completed savepoint."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.commit_head import read_commit_head
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import delta_commits, delta_history, delta_rows
from tests.e2e.procs import driver_processes, kill, wait_gone
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import EXAMPLE_JOBS, Totals, running_with_checkpoint
from tests.support.triggers import idle_trigger
from tests.support.waits import wait_for

# The first test: two driver starts and a kill, about 3 minutes on a loaded machine (make test-all).
pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

WATCHER = "e2e_on_commits"
JOB = "e2e_watched"  # fixed in tests/e2e/dags/e2e_dags.py, as the table's path


def payloads(api: AirflowApi, dag_id: str = WATCHER) -> dict[str, list[dict[str, Any]]]:
    """The trigger payloads each successful run of a watching DAG saw, by run id."""
    runs = api.request("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]
    seen = {}
    for run in runs:
        if run["state"] == "success":
            seen[run["dag_run_id"]] = [event["payload"]
                                       for event in api.xcom(dag_id, run["dag_run_id"], "seen")]
    return seen


def watcher_cursor(stack: AirflowStack, kind: str = "commits", job: str = JOB) -> dict[str, Any] | None:
    """A watcher's cursor in Airflow's asset state store (the stack's database)."""
    with contextlib.closing(sqlite3.connect(f"file:{stack.home}/airflow.db?mode=ro", uri=True,
                                            timeout=30)) as db:
        row = db.execute("SELECT value FROM asset_state_store WHERE key LIKE ?",
                         (f"sparkpoint.{kind}.{job}.%",)).fetchone()
    return dict(json.loads(row[0])) if row else None


def batches_seen(api: AirflowApi, dag_id: str = WATCHER) -> list[tuple[int, int]]:
    """(generation, last batch) of every commit event a watching DAG's runs saw."""
    return sorted((p["generation"], p["last_batch"]) for seen in payloads(api, dag_id).values() for p in seen)


def test_a_dag_on_the_output_asset_runs_after_each_commit_and_never_for_an_aborted_batch(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "watched", root=airflow_stack.home / "sparkpoint")
    pipeline.job, pipeline.output = JOB, airflow_stack.home / "watched-table"
    airflow_api.wait_dag(WATCHER)
    airflow_api.unpause(WATCHER)  # Airflow runs the watchers of unpaused DAGs only
    start = wait_for("the commit watcher's start in Airflow's asset state store",
                     lambda: watcher_cursor(airflow_stack), 300, airflow_stack.tails)
    assert start["seq"] == 0 and start["txn_id"] is None, start  # nothing committed yet

    pipeline.write_many(1)  # batch 0
    stream = airflow_api.trigger("e2e_stream",
                                 pipeline.params(trigger="processingTime:1s", pause_at="recorded:1"))
    describe = lambda: airflow_api.describe("e2e_stream", stream)
    first = wait_for("the first generation to checkpoint batch 0",
                     lambda: running_with_checkpoint(pipeline, 0), 600, describe)
    assert wait_for("a run of the watching DAG for batch 0", lambda: batches_seen(airflow_api), 300,
                    airflow_stack.tails) == [(first, 0)]

    # Batch 1 is staged and recorded; the driver holds before Spark commits it. Its task
    # is marked failed: the supervisor kills the driver, batch 1 is never confirmed.
    pipeline.write_many(1)
    held = wait_for("the driver to hold after recording batch 1", lambda: pipeline.reached("recorded"), 300,
                    describe)
    assert held["batch"] == 1, held
    [staged] = [t for t in pipeline.catalog.transactions() if t.batch_id == 1]
    assert staged.generation == first, staged
    drivers = driver_processes(JOB, airflow_stack.token)
    airflow_api.mark("e2e_stream", stream, "job", "failed")
    assert wait_gone(drivers, timeout=120) == [], "a driver survived the supervisor's kill"
    assert [c["batch"] for c in delta_commits(pipeline.output)] == [0]

    # The next run aborts generation 1's transaction of batch 1 at restore and commits the
    # batch as its own; the watching DAG hears of that commit only.
    restart = airflow_api.trigger("e2e_stream", pipeline.params(trigger="processingTime:1s"))
    second = wait_for("the second generation to checkpoint batch 1",
                      lambda: running_with_checkpoint(pipeline, 1, after_generation=first), 600,
                      lambda: airflow_api.describe("e2e_stream", restart))
    wait_for("a run of the watching DAG for batch 1", lambda: (second, 1) in batches_seen(airflow_api), 300,
             airflow_stack.tails)
    ControlChannel(pipeline.catalog).submit("stop", timeout_s=300, generation=second, requested_by="e2e test")
    airflow_api.wait_task("e2e_stream", restart, "job", {"success"}, timeout=300)

    commits = pipeline.assert_exact()
    assert [(c["batch"], c["generation"]) for c in commits] == [(0, first), (1, second)], commits
    seen = batches_seen(airflow_api)
    assert (first, 1) not in seen, f"the aborted batch 1 of generation {first} triggered the DAG: {seen}"
    assert set(seen) == {(first, 0), (second, 1)}, seen
    every = [p for runs in payloads(airflow_api).values() for p in runs]
    assert all(p["job"] == JOB and p["kind"] == "commit" and p["sink_version"] is not None for p in every), \
        every
    # The watcher's position is kept by Airflow (a restarted triggerer resumes from it).
    newest = max(p["seq"] for p in every)
    wait_for("the watcher to save its cursor",
             lambda: (watcher_cursor(airflow_stack) or {}).get("seq") == newest,
             120, airflow_stack.tails)


DEPLOYED = "e2e_deployed"  # fixed in tests/e2e/dags/e2e_dags.py, as its table's path
ON_DEPLOYED = "e2e_on_deployed_commits"
DEPLOY = "e2e_deploy_on_savepoint"
BLUE_GREEN = "example_sparkpoint_blue_green"


def covered_batches(events: list[dict[str, Any]]) -> list[int]:
    """The batches a run of commit events reports, in `seq` order; each event covers
    ``after_batch`` (excluded) .. ``last_batch``, and must follow the previous one."""
    covered: list[int] = []
    for before, event in zip([None, *events], events):
        assert event["after_batch"] == (before["last_batch"] if before else None), (before, event)
        start = -1 if event["after_batch"] is None else event["after_batch"]
        covered += range(start + 1, event["last_batch"] + 1)
    return covered


@pytest.mark.timeout(2400)  # five driver starts, one after the other: about 20 minutes on a loaded machine
def test_commit_and_savepoint_watchers_through_a_killed_driver_a_failed_savepoint_and_a_rolled_back_green(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    """One streaming job (``dags/jobs/keyed_totals.py``) as a task of ``e2e_submit``:

    * try 1 holds after recording batch 1 (staged, not committed) and its driver is
      SIGKILLed; try 2 aborts that transaction at restore and commits batch 1 itself;
    * try 2 is SIGKILLed half-way through copying a savepoint (a failed savepoint);
      try 3 resumes and is blue;
    * the example blue-green DAG stops blue with a savepoint, green stages a batch and
      fails, the deploy is rolled back (green's staged batch aborted) and blue restored.

    ``e2e_on_deployed_commits`` (on the table) must have heard of every commit once and of
    nothing else; ``e2e_deploy_on_savepoint`` (on the savepoints) ran once, for the
    completed savepoint, with its URI."""
    pipeline = Totals(tmp_path, "deployed", root=airflow_stack.home / "sparkpoint")
    pipeline.job, pipeline.output = DEPLOYED, airflow_stack.home / "deployed-table"
    for dag_id in (ON_DEPLOYED, DEPLOY):
        airflow_api.wait_dag(dag_id)
        airflow_api.unpause(dag_id)
    start = wait_for("the commit watcher's start", lambda: watcher_cursor(airflow_stack, "commits", DEPLOYED),
                     300, airflow_stack.tails)
    assert start["seq"] == 0 and start["txn_id"] is None, start
    assert wait_for("the savepoint watcher's start",
                    lambda: watcher_cursor(airflow_stack, "savepoints", DEPLOYED),
                    300, airflow_stack.tails) == {"known": []}
    seen = lambda: batches_seen(airflow_api, ON_DEPLOYED)

    # Try 1 runs every second; tries 2 and 3 fire once, then not for weeks (`idle_trigger`),
    # so that (once they ran their first micro-batch) they leave new input alone: blue
    # must not read green's.
    dag = "e2e_submit"
    pipeline.write_many(1)  # batch 0
    run = airflow_api.trigger(dag, pipeline.params(
        script=str(EXAMPLE_JOBS / "keyed_totals.py"), version=1, trigger="processingTime:1s",
        retry_trigger=idle_trigger(), pause_at="recorded:1", fault="savepoint:1", fault_try=2))
    describe = lambda: airflow_api.describe(dag, run)
    first = wait_for("try 1 to checkpoint batch 0", lambda: running_with_checkpoint(pipeline, 0), 600,
                     describe)
    assert wait_for("a run on the commit of batch 0", seen, 300, airflow_stack.tails) == [(first, 0)]

    # --- kill 1: batch 1 staged and recorded, never confirmed
    pipeline.write_many(1)
    held = wait_for("try 1 to hold after recording batch 1", lambda: pipeline.reached("recorded"), 300,
                    describe)
    assert held["batch"] == 1, held
    [staged] = [t for t in pipeline.catalog.transactions() if t.batch_id == 1]
    assert staged.generation == first, staged
    drivers = driver_processes(DEPLOYED, airflow_stack.token)
    assert held["pid"] in {p.pid for p in drivers}, (held, drivers)
    assert wait_gone(kill(drivers, signal.SIGKILL), timeout=60) == [], "the SIGKILLed driver is still running"
    assert [c["batch"] for c in delta_commits(pipeline.output)] == [0]

    second = wait_for("try 2 to checkpoint batch 1", lambda: running_with_checkpoint(pipeline, 1, first), 600,
                      describe)
    wait_for("a run on try 2's commit of batch 1", lambda: (second, 1) in seen(), 300, airflow_stack.tails)
    first_log = airflow_api.log(dag, run, "job", 1)
    assert "Error code is: -9" in first_log or "Error code is: 137" in first_log, first_log[-3000:]

    # --- kill 2: a savepoint half copied. Batch 2's input is already there: try 3 reads
    # it in its first micro-batch (try 2 would in ten minutes).
    pipeline.write_many(1)
    request = ControlChannel(pipeline.catalog).submit("savepoint", timeout_s=600, generation=second,
                                                      requested_by="e2e test")
    airflow_api.wait_task(dag, run, "job", {"running"}, timeout=600, try_number=3)
    second_log = airflow_api.log(dag, run, "job", 2)
    assert "SPARKPOINT_TEST_FAULT: killing driver at savepoint:1" in second_log, second_log[-3000:]
    assert ControlChannel(pipeline.catalog).pending(generation=second + 1) == [], \
        "try 2's request outlived it"
    blue = wait_for("try 3 (blue) to checkpoint batch 2",
                    lambda: running_with_checkpoint(pipeline, 2, second), 600, describe)
    wait_for("a run on blue's commit of batch 2", lambda: (blue, 2) in seen(), 300, airflow_stack.tails)
    assert [e.metadata for e in pipeline.catalog.list_savepoints()] in ([], [None]), (
        f"request {request.id}: a savepoint completed before the deploy")

    # --- a rolled-back green: green stages batch 3 and fails in batch 4
    pipeline.write_many(3)  # batches 3, 4, 5
    deploy = airflow_api.trigger(BLUE_GREEN, {"job_name": DEPLOYED, "input": str(pipeline.input),
                                              "output": str(pipeline.output), "green_fail_after_batch": 3,
                                              "blue_trigger": "availableNow", "preflight": False})
    assert airflow_api.wait_run(BLUE_GREEN, deploy, timeout=1200) == "failed", \
        airflow_api.describe(BLUE_GREEN, deploy)
    states = airflow_api.task_states(BLUE_GREEN, deploy)
    tasks = ("stop_blue", "start_green", "abort_green", "restore_blue", "rolled_back")
    assert {k: states[k] for k in tasks} == {
        "stop_blue": "success", "start_green": "failed", "abort_green": "success", "restore_blue": "success",
        "rolled_back": "failed"}, airflow_api.describe(BLUE_GREEN, deploy)
    savepoint = airflow_api.xcom(BLUE_GREEN, deploy, "stop_blue")
    green = airflow_api.xcom(BLUE_GREEN, deploy, "start_green", key="generation")
    assert green == blue + 1, (green, blue)
    aborted = airflow_api.xcom(BLUE_GREEN, deploy, "abort_green")["aborted"]
    assert aborted, "green's staged batch was not aborted"
    restored = airflow_api.xcom(BLUE_GREEN, deploy, "restore_blue")
    # the rollback claimed green + 1 to fence green; blue's restore is the next one
    assert restored["restored_from"] == savepoint and restored["generation"] == green + 2, restored
    assert restored["status"] == "finished" and restored["last_batch"] == 5, restored
    airflow_api.wait_task(dag, run, "job", {"success"}, timeout=300, try_number=3)
    assert airflow_api.xcom(dag, run, "job")["status"] == "stopped"

    # The table is the input's totals, every batch committed once, by these generations.
    commits = pipeline.assert_exact()
    assert [(c["batch"], c["generation"]) for c in commits] == [
        (0, first), (1, second), (2, blue), (3, green + 1), (4, green + 1), (5, green + 1)], commits
    assert {r["code_version"] for r in delta_rows(pipeline.output)} == {1}, "green's output reached the table"
    assert pipeline.catalog.transactions() == []

    # Every commit was heard of once (events follow each other without a gap or an
    # overlap), each as the table's Delta version it made; nothing staged or aborted.
    versions = {(e["batch"], e["generation"]): e["version"] for e in delta_history(pipeline.output)
                if e["batch"] is not None}
    last = max(versions)
    wait_for("a run on the last commit", lambda: last[::-1] in seen(), 300, airflow_stack.tails)
    events = sorted((p for runs in payloads(airflow_api, ON_DEPLOYED).values() for p in runs),
                    key=lambda p: p["seq"])
    assert covered_batches(events) == list(range(6)), events
    for event in events:
        assert versions.get((event["last_batch"], event["generation"])) == event["sink_version"], \
            (event, versions)
        assert event["generation"] != green and (event["generation"], event["last_batch"]) != (first, 1), \
            event
    head = read_commit_head(pipeline.catalog)
    assert head is not None and (head.seq, head.batch, head.generation) == (
        events[-1]["seq"], 5, green + 1), (head, events[-1])

    # The deploy DAG ran once: on the completed savepoint, never on the half-copied one.
    completed = [e for e in pipeline.catalog.list_savepoints() if e.metadata is not None]
    assert [e.uri for e in completed] == [savepoint], completed
    wait_for("a run of the deploy DAG", lambda: payloads(airflow_api, DEPLOY), 300, airflow_stack.tails)
    deploys = payloads(airflow_api, DEPLOY)
    assert [[(p["kind"], p["savepoint"]) for p in runs] for runs in deploys.values()] == [
        [("savepoint", savepoint)]], deploys
