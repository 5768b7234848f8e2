"""The example blue-green DAG (``dags/example_sparkpoint_blue_green.py``, unchanged: the
test sets only its params) under a real Airflow, with blue as a real long-running
streaming *task* of the same Airflow (``dags/jobs/keyed_totals.py --version 1`` with a
``processingTime`` trigger, in the ``e2e_stream`` test DAG), not a process on the side.

* publish: the pre-flight restores green from blue's newest checkpoint in scratch, then
  stop-with-savepoint ends the blue task (success, status ``stopped``), green
  restores the savepoint, passes the health gate and the audit, and is published;
* rollback: green fails after its first batch, its staged output is aborted and blue
  is restored from the same savepoint; green's output never reaches the table.

The Delta table is checked row by row against totals computed here from the input.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.demo.support import delta_commits, delta_rows, orphaned_staged_files
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import EXAMPLE_JOBS, Totals, running_with_checkpoint
from tests.support.triggers import idle_trigger
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

#: the example DAG's zero-downtime path, skipped on the stop-savepoint-start path
ZERO_DOWNTIME_SKIPPED = {t: "skipped" for t in (
    "preflight_zero_downtime", "start_green_zero_downtime", "cutover", "blue_stopped",
    "restore_blue_after_cutover", "cutover_called_off")}

DAG = "example_sparkpoint_blue_green"
# Blue's backlog (blue's first micro-batch) and the input that arrives for green.
BLUE_FILES = [("u0", "u1", "u2"), ("u0", "u1", "u2")]
GREEN_FILES = [("u1", "u2", "u3"), ("u1", "u3"), ("u2", "u3")]
# Blue reads its backlog at once, then its next trigger is weeks away (`idle_trigger`):
# what arrives afterwards is green's, whatever the timing (the stop request is polled
# every 0.5 s regardless of the trigger). It was a 10-minute trigger, which fires at the
# clock's next round ten minutes: a slow run saw blue read green's input.
BLUE_TRIGGER = idle_trigger()


def amount(index: int, user: str) -> int:
    return index * 10 + int(user[1:])


def expected(green_version: int | None) -> dict[str, tuple[int, int, int]]:
    """(total, events, code_version) by user: blue's backlog only (`green_version` None),
    or all input with the rows of green's files written by code `green_version`."""
    files: list[tuple[Iterable[str], int]] = [(users, 1) for users in BLUE_FILES]
    if green_version is not None:
        files += [(users, green_version) for users in GREEN_FILES]
    totals: dict[str, tuple[int, int, int]] = {}
    for index, (users, version) in enumerate(files):
        for user in users:
            total, count, _ = totals.get(user, (0, 0, 1))
            totals[user] = (total + amount(index, user), count + 1, version)
    return totals


def table(pipeline: Totals) -> dict[str, tuple[int, int, int]]:
    rows = delta_rows(pipeline.output)
    got = {r["user"]: (int(r["total"]), int(r["events"]), int(r["code_version"])) for r in rows}
    assert len(got) == len(rows), f"a user appears twice: {rows}"
    return got


def start_blue(api: AirflowApi, stack: AirflowStack, tmp_path: Path, name: str) -> tuple[Totals, str, int]:
    """Blue as a streaming task; once it committed its backlog, green's input arrives.
    Its storage root is the ``sparkpoint_default`` connection's, which the example DAG
    may use instead of its ``checkpoint_dir`` param."""
    pipeline = Totals(tmp_path, name, root=stack.home / "sparkpoint")
    for users in BLUE_FILES:
        index = len(pipeline.files)
        pipeline.write((u, amount(index, u)) for u in users)
    blue = api.trigger("e2e_stream", pipeline.params(script=str(EXAMPLE_JOBS / "keyed_totals.py"), version=1,
                                                     files_per_batch=100, trigger=BLUE_TRIGGER))
    describe = lambda: api.describe("e2e_stream", blue)
    generation = wait_for("blue's first checkpoint", lambda: running_with_checkpoint(pipeline, 0), 600,
                          describe)
    wait_for("blue's first commit", lambda: table(pipeline) == expected(None), 120, describe)
    for users in GREEN_FILES:
        index = len(pipeline.files)
        pipeline.write((u, amount(index, u)) for u in users)
    assert api.task_instance("e2e_stream", blue, "job")["state"] == "running"
    return pipeline, blue, generation


def bg_params(pipeline: Totals, **extra: Any) -> dict[str, Any]:
    return {"job_name": pipeline.job, "input": str(pipeline.input), "output": str(pipeline.output),
            "checkpoint_dir": str(pipeline.root), **extra}


def assert_blue_stopped(api: AirflowApi, blue: str, run: str) -> str:
    """The blue task ended by stop-with-savepoint; returns the savepoint."""
    savepoint = api.xcom(DAG, run, "stop_blue")
    api.wait_task("e2e_stream", blue, "job", {"success"}, timeout=300)
    result = api.xcom("e2e_stream", blue, "job")
    assert result["status"] == "stopped" and result["savepoint"] == savepoint, (result, savepoint)
    assert result["last_batch"] == 0, result  # blue never saw green's input
    return str(savepoint)


def assert_committed_once(pipeline: Totals) -> list[dict[str, Any]]:
    commits = delta_commits(pipeline.output)
    batches = [c["batch"] for c in commits]
    assert len(batches) == len(set(batches)), f"a batch was committed twice: {commits}"
    assert orphaned_staged_files(pipeline.output, pipeline.job) == []
    return commits


def test_blue_green_with_a_streaming_blue_task_publishes_a_healthy_green(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline, blue, blue_generation = start_blue(airflow_api, airflow_stack, tmp_path, "bg_publish")

    run = airflow_api.trigger(DAG, bg_params(pipeline))
    state = airflow_api.wait_run(DAG, run, timeout=1200)
    assert state == "success", airflow_api.describe(DAG, run)
    assert airflow_api.task_states(DAG, run) == {
        "deploy_path": "success", **ZERO_DOWNTIME_SKIPPED, "preflight_green": "success",
        "stop_blue": "success", "start_green": "success", "green_healthy": "success",
        "audit_green": "success",
        "decide": "success", "publish_green": "success", "abort_green": "skipped", "restore_blue": "skipped",
        "rolled_back": "skipped",
    }
    savepoint = assert_blue_stopped(airflow_api, blue, run)
    preflight = airflow_api.xcom(DAG, run, "preflight_green")  # green's code read blue's state, in scratch
    assert preflight["ok"] and preflight["result"]["batches_processed"] >= 1, preflight
    green = airflow_api.xcom(DAG, run, "start_green")
    assert green["generation"] == blue_generation + 1 and green["restored_from"] == savepoint, green
    assert green["first_batch"] == 1 and green["committed_batches"] == [], green  # staged only
    assert airflow_api.xcom(DAG, run, "green_healthy")["count"] >= 2
    assert airflow_api.xcom(DAG, run, "audit_green") == {"approved": True, "problems": [], "rows": 7}
    assert len(airflow_api.xcom(DAG, run, "publish_green")["committed"]) == 3
    assert table(pipeline) == expected(green_version=2)
    commits = assert_committed_once(pipeline)
    assert [(c["batch"], c["generation"]) for c in commits] == [
        (0, blue_generation), (1, green["generation"]), (2, green["generation"]), (3, green["generation"])]


@pytest.mark.slow  # three Spark runs (blue, green, blue again): `make test-e2e` / `make test-all`
def test_blue_green_with_a_streaming_blue_task_rolls_back_a_failing_green(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline, blue, blue_generation = start_blue(airflow_api, airflow_stack, tmp_path, "bg_rollback")

    run = airflow_api.trigger(DAG, bg_params(pipeline, green_fail_after_batch=1, blue_trigger="availableNow"))
    state = airflow_api.wait_run(DAG, run, timeout=1200)
    assert state == "failed", airflow_api.describe(DAG, run)  # a rolled-back deploy alerts
    states = airflow_api.task_states(DAG, run)
    assert states == {
        "deploy_path": "success", **ZERO_DOWNTIME_SKIPPED, "preflight_green": "success",
        "stop_blue": "success", "start_green": "failed", "green_healthy": "upstream_failed",
        "audit_green": "upstream_failed", "decide": "success", "publish_green": "skipped",
        "abort_green": "success", "restore_blue": "success", "rolled_back": "failed",
    }, airflow_api.describe(DAG, run)
    savepoint = assert_blue_stopped(airflow_api, blue, run)
    # The generation green claimed: published by green's task (or, by older releases of the
    # example, by the decide task).
    green_generation = (airflow_api.xcom(DAG, run, "start_green", key="generation")
                        or airflow_api.xcom(DAG, run, "decide", key="green_generation"))
    assert green_generation == blue_generation + 1
    assert airflow_api.xcom(DAG, run, "abort_green")["aborted"], "green's staged output must be aborted"
    restored = airflow_api.xcom(DAG, run, "restore_blue")
    assert restored["status"] == "finished" and restored["restored_from"] == savepoint, restored
    # the rollback claimed green + 1 to fence green; blue's restore is the next one
    assert restored["generation"] == green_generation + 2 and restored["first_batch"] == 1, restored
    assert table(pipeline) == expected(green_version=1)
    commits = assert_committed_once(pipeline)
    assert green_generation not in {c["generation"] for c in commits}, f"green committed: {commits}"
    assert [c["batch"] for c in commits] == [0, 1, 2, 3]
    assert pipeline.catalog.transactions() == []
