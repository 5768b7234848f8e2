"""The pre-flight of a blue-green deploy (`SparkpointPreflightOperator`) with `dag.test()`,
a real running blue (its own ``spark-submit``, as in production) and real drills.

Blue (``jobs/preflight_totals.py --state v1``, a streaming aggregation) runs with a
ten-minute trigger: it commits its backlog, then the input written for green waits.
Deploy DAG: ``preflight >> stop_blue (stop-with-savepoint) >> start_green``.

1. Green with an added aggregate (the aggregation's state has another column): Spark
   refuses the restore in the drill, the task fails with Spark's error, ``stop_blue``
   never runs; blue is still running, in the same generation, with no control request,
   and its table is exactly what its input says.
2. A compatible green: the pre-flight passes, blue stops with a savepoint (exit code 0),
   green restores it and catches up; the table is exact and every batch committed once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import (
    SPARK_CONF,
    SubmittedJob,
    delta_commits,
    delta_rows,
    write_batch_file,
)
from tests.support.dag_runs import new_dag, run_dag, spark_default_connection, task_states
from tests.support.triggers import idle_trigger

pytestmark = [pytest.mark.airflow, pytest.mark.spark,
              pytest.mark.slow]  # blue, two drills and green: four drivers, about three minutes

JOB_SCRIPT = Path(__file__).resolve().parent / "jobs" / "preflight_totals.py"
BLUE_FILES = [("u0", "u1", "u2")]
GREEN_FILES = [("u1", "u3"), ("u2", "u3")]


def rows_of(index: int, users: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"user": u, "amount": index * 10 + int(u[1:]) + 1} for u in users]


def expected(files: list[tuple[str, ...]], green_from: int) -> dict[str, tuple[int, int, int]]:
    """(total, events, code_version) by user, in plain Python from the input: a user's
    row carries code version 2 once a file from `green_from` on touched it."""
    table: dict[str, tuple[int, int, int]] = {}
    for index, users in enumerate(files):
        for row in rows_of(index, users):
            total, events, version = table.get(row["user"], (0, 0, 1))
            table[row["user"]] = (total + row["amount"], events + 1, 2 if index >= green_from else version)
    return table


def store_files(blue: SubmittedJob) -> dict[str, bytes]:
    """Everything under blue's job root but its heartbeat records (which a running blue
    rewrites): a pre-flight adds, changes and removes nothing there."""
    root = blue.root / blue.job
    files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {key: path.read_bytes() for key, path in files.items()
            if key != "status.json" and not key.startswith("status/")}


def table(path: Path) -> dict[str, tuple[int, int, int]]:
    rows = delta_rows(path)
    got = {r["user"]: (int(r["total"]), int(r["events"]), int(r["code_version"])) for r in rows}
    assert len(got) == len(rows), f"a user appears twice: {rows}"
    return got


@pytest.fixture
def spark_default() -> Iterator[None]:
    with spark_default_connection():
        yield


def deploy_dag(blue: SubmittedJob, green_state: str, drills: Path) -> Any:
    from airflow_sparkpoint.operators import (
        SparkpointPreflightOperator,
        SparkpointSavepointOperator,
        SparkpointSubmitOperator,
    )

    green: dict[str, Any] = {
        "job_name": blue.job, "checkpoint_dir": str(blue.root), "application": str(JOB_SCRIPT),
        "application_args": ["--input", str(blue.input), "--output", str(blue.output), "--state",
                             green_state],
        "conn_id": "spark_default", "conf": dict(SPARK_CONF),
    }
    with new_dag(f"preflight_{green_state}") as dag:
        preflight = SparkpointPreflightOperator(task_id="preflight",
                                                output_args={"--output": "{scratch}/totals"},
                                                drill_dir=str(drills), **green)
        stop_blue = SparkpointSavepointOperator(task_id="stop_blue", job_name=blue.job,
                                                checkpoint_dir=str(blue.root), stop=True, timeout="5 minutes")
        start_green = SparkpointSubmitOperator(task_id="start_green", restore=stop_blue.output,
                                               trigger="availableNow", retries=0, **green)
        preflight >> stop_blue >> start_green
    return dag


def test_an_incompatible_green_is_refused_before_blue_stops_and_a_compatible_one_deploys(
        airflow_home: Path, spark_default: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blue = SubmittedJob(tmp_path / "pipeline", JOB_SCRIPT, "preflight_totals", idle_trigger(),
                        ["--state", "v1"])
    files: list[tuple[str, ...]] = []
    for users in BLUE_FILES:
        write_batch_file(blue.input, len(files), rows_of(len(files), users))
        files.append(users)
    blue.start()
    try:
        generation = blue.wait_checkpointed(0)
        blue.wait_for("blue's first commit", lambda: blue.output.exists() and table(blue.output) == expected(
            files, green_from=len(files)))
        for users in GREEN_FILES:  # green's input: blue's next trigger is ten minutes away
            write_batch_file(blue.input, len(files), rows_of(len(files), users))
            files.append(users)
        checkpoints = [m.id for m in blue.catalog.checkpoints()]
        stored = store_files(blue)

        # 1. green with an added aggregate: refused by the pre-flight, blue untouched
        refused = run_dag(deploy_dag(blue, "added_aggregate", tmp_path / "drills-refused"))

        states = task_states(refused)
        assert states == {"preflight": "failed", "stop_blue": "upstream_failed",
                          "start_green": "upstream_failed"}, states
        error = capsys.readouterr().out  # dag.test() logs the task's failure here
        assert "pre-flight refused" in error and "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in error, \
            error[-3000:]
        assert blue.running, blue.tail()
        status = blue.status()
        assert status is not None and (status.state, status.generation) == ("running", generation), status
        assert blue.catalog.current_generation() == generation
        assert ControlChannel(blue.catalog).request_ids() == []
        assert [m.id for m in blue.catalog.checkpoints()] == checkpoints
        assert store_files(blue) == stored, "the pre-flight wrote to blue's store"
        assert table(blue.output) == expected(files[:len(BLUE_FILES)], green_from=len(BLUE_FILES))

        # 2. a compatible green: the pre-flight passes, blue stops, green deploys
        deployed = run_dag(deploy_dag(blue, "v2", tmp_path / "drills-deployed"))

        assert task_states(deployed) == {"preflight": "success", "stop_blue": "success",
                                         "start_green": "success"}, task_states(deployed)
        assert blue.wait_exit() == 0, blue.tail()
    finally:
        blue.kill()
    [ti] = [t for t in deployed.get_task_instances() if t.task_id == "preflight"]
    passed = ti.xcom_pull(task_ids="preflight")
    assert passed["ok"] and passed["result"]["batches_processed"] >= 1, passed
    assert passed["result"]["job"] == f"{blue.job}-preflight"
    assert table(blue.output) == expected(files, green_from=len(BLUE_FILES))
    commits = delta_commits(blue.output)
    assert sorted(c["batch"] for c in commits) == list(range(len(files))), commits
    assert blue.catalog.current_generation() == generation + 1  # green; no drill claimed one of blue's
    assert list((tmp_path / "drills-deployed").iterdir()) == [], \
        "the drill's scratch directory was left behind"
