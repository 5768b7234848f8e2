"""A rollback after a zero-downtime cutover restores blue's final savepoint, with real
drivers (issue 49): blue (``spark-submit``, Delta append) stops after the agreed N and
takes its final savepoint of N; green (code that counts every amount twice, warmed up
from K < N in its shadow) claims the job at N and takes its adoption checkpoint (green's
state at N: doubled amounts after K) but commits nothing; green is rolled back
(`services.rollback.abort_stopped_generation`), then blue's code starts again with
``restore=latest`` and runs the batches after N.

Oracle (plain Python from the input files): every batch committed once by blue's
lineage, with blue's totals throughout, i.e. blue's state at N restored from its
savepoint, not green's (whose totals after N would count the amounts after K twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.demo.support import write_batch_file
from airflow_sparkpoint.services.rollback import abort_stopped_generation
from tests.support.cutover_run import blue_conf, run_cutover, sparkpoint_commits, users_of
from tests.support.shadow_totals import JOB_SCRIPT, batch_rows, green_totals, rows_of
from tests.support.submit import spark_submit_command, start_spark_submit, submit_env

# two blue spark-submits and green beside the first, minutes
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_rollback_after_the_cutover_restores_blue_s_final_savepoint_state(
    spark: Any, tmp_path: Path
) -> None:
    run = run_cutover(spark, tmp_path, after_n=0, green_commits=False)
    tail = run.log.read_text(errors="replace")[-4000:] if run.log else ""
    assert run.blue_exit == 0, f"blue's spark-submit exited {run.blue_exit}:\n{tail}"
    assert run.green_error is None, repr(run.green_error)
    n, k, gb = run.n, run.k, run.blue_generation
    green = gb + 1
    assert k < n == len(run.files) - 1
    assert all(c["generation"] == gb for c in run.commits), "green committed nothing"

    # Blue's stop after N named its final savepoint of N; green's claim records it.
    catalog = run.catalog
    stop = ControlChannel(catalog).result(run.stop_request)
    assert (stop.state, stop.batch_id) == ("completed", n) and stop.savepoint is not None, stop
    saved = catalog.own_snapshot(stop.savepoint)
    assert saved is not None
    assert (saved.metadata.kind, saved.metadata.batch_id, saved.metadata.generation) == ("savepoint", n, gb)
    state = CutoverStore(catalog).read(run.cutover_id)
    assert state.claimed is not None and state.claimed.savepoint == stop.savepoint, state
    assert any(m.generation == green and m.batch_id == n for m in catalog.checkpoints()), \
        "green's adoption checkpoint"

    # The rollback of green returns the job's lineage to blue's savepoint of N.
    aborted = abort_stopped_generation(catalog, green, max_heartbeat_age=60.0,
                                       how_to_stop="stop green's task")
    assert aborted == []
    origin = catalog.origins()[-1]
    assert ((origin.generation, origin.kind, origin.uri, origin.batch_id)
            == (green + 1, "savepoint", stop.savepoint, n))
    shown = CutoverStore(catalog).read(run.cutover_id).to_json()
    assert ((shown["step"], shown["rolled_back_to"], shown["blue_savepoint"])
            == ("rolled_back", stop.savepoint, stop.savepoint))

    # Blue's code starts again (restore=latest) and runs three batches after N.
    files = list(run.files)
    while len(files) <= n + 3:
        index = len(files)
        write_batch_file(run.base / "blue" / "input", index, rows_of(index, users_of(index)))
        files.append(users_of(index))
    env = submit_env()
    conf = {**blue_conf(run.root), "spark.sparkpoint.trigger": "availableNow"}
    log = run.base / "blue" / "restart.log"
    cmd = spark_submit_command(JOB_SCRIPT, conf, ["--input", str(run.base / "blue" / "input"), "--output",
                                                  str(run.output), "--sink", "delta"], env=env)
    proc = start_spark_submit(cmd, env=env, log=log)
    assert proc.wait(timeout=300) == 0, log.read_text(errors="replace")[-4000:]

    restart = next(o for o in catalog.origins() if o.generation == green + 2)
    assert (restart.kind, restart.uri, restart.batch_id) == ("savepoint", stop.savepoint, n), restart
    commits = sparkpoint_commits(run.output)
    last = len(files) - 1
    by_batch = sorted((c["batch"], c["generation"]) for c in commits)
    assert by_batch == [(b, gb) for b in range(n + 1)] + [(b, green + 2) for b in range(n + 1, last + 1)], \
        by_batch
    rows = batch_rows(run.output, commits)
    blue_oracle = green_totals(files, last)  # blue's code throughout
    assert rows == {b: blue_oracle[b] for b in range(last + 1)}
    carried = _green_state_carried_on(files, k, n)  # had the rollback returned to green's checkpoint
    assert any(carried[b] != blue_oracle[b] for b in range(n + 1, last + 1)), \
        "the oracle must tell blue's restored state from green's"


def _green_state_carried_on(files: list[tuple[str, ...]], k: int, n: int) -> list[dict[str, tuple[int, int]]]:
    """(total, events) by user after each batch had blue's code gone on from green's state
    at N: amounts doubled in batches K+1..N (green's shadow), single after N."""
    totals: dict[str, tuple[int, int]] = {}
    after = []
    for index, users in enumerate(files):
        for row in rows_of(index, users):
            total, events = totals.get(row["user"], (0, 0))
            totals[row["user"]] = (total + row["amount"] * (2 if k < index <= n else 1), events + 1)
        after.append({u: totals[u] for u in users})
    return after
