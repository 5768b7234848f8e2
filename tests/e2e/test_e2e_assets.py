"""Committed data as asset events under a real Airflow: ``e2e_on_commits`` is scheduled on
the Delta table of a streaming job through an `AssetWatcher` whose
`SparkpointCommitTrigger` runs in the ``airflow triggerer`` process. It runs after each
commit, and never for a batch that was staged and recorded but then aborted: the driver
is held after recording batch 1 and its task is marked failed (the supervisor kills it);
the next run aborts that transaction at restore and commits batch 1 again as its own."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import delta_commits
from tests.e2e.procs import driver_processes, wait_gone
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.e2e.support import Totals, running_with_checkpoint
from tests.support.waits import wait_for

# Two driver starts and a kill: about 3 minutes on a loaded machine (make test-all).
pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

WATCHER = "e2e_on_commits"
JOB = "e2e_watched"  # fixed in tests/e2e/dags/e2e_dags.py, as the table's path


def payloads(api: AirflowApi) -> dict[str, list[dict[str, Any]]]:
    """The trigger payloads each successful run of the watching DAG saw, by run id."""
    runs = api.request("GET", f"/dags/{WATCHER}/dagRuns", params={"limit": 100})["dag_runs"]
    seen = {}
    for run in runs:
        if run["state"] == "success":
            seen[run["dag_run_id"]] = [event["payload"] for event in api.xcom(WATCHER, run["dag_run_id"], "seen")]
    return seen


def watcher_cursor(stack: AirflowStack) -> dict[str, Any] | None:
    """The commit watcher's cursor in Airflow's asset state store (the stack's database)."""
    with contextlib.closing(sqlite3.connect(f"file:{stack.home}/airflow.db?mode=ro", uri=True, timeout=30)) as db:
        row = db.execute("SELECT value FROM asset_state_store WHERE key LIKE ?",
                         (f"sparkpoint.commits.{JOB}.%",)).fetchone()
    return dict(json.loads(row[0])) if row else None


def batches_seen(api: AirflowApi) -> list[tuple[int, int]]:
    """(generation, last batch) of every commit event the watching DAG's runs saw."""
    return sorted((p["generation"], p["last_batch"]) for seen in payloads(api).values() for p in seen)


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
    stream = airflow_api.trigger("e2e_stream", pipeline.params(trigger="processingTime:1s", pause_at="recorded:1"))
    describe = lambda: airflow_api.describe("e2e_stream", stream)
    first = wait_for("the first generation to checkpoint batch 0", lambda: running_with_checkpoint(pipeline, 0),
                     600, describe)
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
    assert all(p["job"] == JOB and p["kind"] == "commit" and p["sink_version"] is not None for p in every), every
    # The watcher's position is kept by Airflow (a restarted triggerer resumes from it).
    newest = max(p["seq"] for p in every)
    wait_for("the watcher to save its cursor", lambda: (watcher_cursor(airflow_stack) or {}).get("seq") == newest,
             120, airflow_stack.tails)
