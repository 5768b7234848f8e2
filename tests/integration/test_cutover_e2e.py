"""A zero-downtime cutover end to end with real drivers (issue 49), both halves joined:
blue by ``spark-submit`` (``processingTime``, Delta append) while input arrives; the test
as the orchestrator plans the cutover (`checkpoints.cutover`), starts green in this
process with ``spark.sparkpoint.shadow.*`` and ``spark.sparkpoint.cutover=<cid>`` (so
green's run builds `runtime.cutover.CutoverHandover` itself) and code that counts every
amount twice, agrees N once green is within the plan's lag and asks blue to stop after N
(`services.cutover.stop_after_batch`); blue stops exactly after N, green claims blue's
job and commits N+1.. into blue's table (`tests/support/cutover_run`).

Oracle (plain Python from the input files): every batch committed once, batches <= N by
blue with blue's totals, batches > N by green with the state green built in its shadow
(blue's totals through the warm-up checkpoint K, doubled amounts after it). The output
gap (blue's commit of N to green's commit of N+1) is printed, not asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from tests.support.cutover_run import TRIGGER_S, commit_gap, run_cutover
from tests.support.shadow_totals import batch_rows, green_totals

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a blue spark-submit and green beside it, minutes


def test_green_takes_the_job_over_at_n_through_the_cutover_records_with_every_batch_once(
        spark: Any, tmp_path: Path) -> None:
    run = run_cutover(spark, tmp_path)
    tail = run.log.read_text(errors="replace")[-4000:] if run.log else ""
    assert run.blue_exit == 0, f"blue's spark-submit exited {run.blue_exit}:\n{tail}"
    assert run.green_error is None, repr(run.green_error)
    n, k, gb = run.n, run.k, run.blue_generation
    last = len(run.files) - 1
    assert k < n < last

    # Blue stopped exactly after N: its stop_after request completed there, with its final checkpoint.
    catalog = run.catalog
    stop = ControlChannel(catalog).result(run.stop_request)
    assert (stop.state, stop.batch_id) == ("completed", n), stop
    assert stop.checkpoint is not None

    # Green's run: the production job from N+1, generation gB + 1, stopped by the orchestrator.
    result = run.green_result
    assert result is not None
    assert (result.status, result.job, result.generation) == ("stopped", "totals", gb + 1), result
    assert (result.first_batch, result.last_batch) == (n + 1, last), result
    assert result.live_reuse["mode"] == "adopted", result.live_reuse
    # The shadow left this JVM's state stores to the production run (closing them is
    # seconds of the gap); the production run's end closed them all, the shadow's too.
    state_stores = spark.sparkContext._jvm.org.apache.spark.sql.execution.streaming.state.StateStore
    assert not state_stores.isMaintenanceRunning()

    # Every batch committed exactly once: one Delta commit per batch, <= N by blue, > N by green.
    by_batch = [(c["batch"], c["generation"]) for c in run.commits]
    assert sorted(by_batch) == ([(b, gb) for b in range(n + 1)]
                                + [(b, gb + 1) for b in range(n + 1, last + 1)]), by_batch

    # Rows: blue's code through N, green's code (its shadow state from K) after N.
    rows = batch_rows(run.output, run.commits)
    blue_oracle = green_totals(run.files, last)  # k >= every batch: blue's code throughout
    green_oracle = green_totals(run.files, k)
    assert {b: rows[b] for b in range(n + 1)} == {b: blue_oracle[b] for b in range(n + 1)}
    assert ({b: rows[b] for b in range(n + 1, last + 1)}
            == {b: green_oracle[b] for b in range(n + 1, last + 1)})
    assert green_oracle[n + 1] != blue_oracle[n + 1], "the oracle must tell green's code from blue's"

    # The cutover's records: claimed by gB + 1 at N with blue's final checkpoint, ended committed.
    state = CutoverStore(catalog).read(run.cutover_id)
    assert state.claimed is not None and state.done is not None, state
    assert ((state.claimed.generation, state.claimed.batch_id, state.claimed.checkpoint)
            == (gb + 1, n, stop.checkpoint))
    assert ((state.done.outcome, state.done.step, state.done.generation)
            == ("committed", "first_commit", gb + 1))
    assert state.progress is not None and state.progress.replayed_batch == n, state.progress
    # Green's lineage starts at blue's final checkpoint X of N (green's own checkpoints
    # since may have retired X itself).
    origins = [o for o in catalog.origins() if o.generation == gb + 1]
    assert [(o.uri, o.batch_id) for o in origins] == [(stop.checkpoint, n)], origins
    assert stop.checkpoint.endswith(f"/chk-{origins[0].base_id}")

    gap, idle = commit_gap(run.commits, n)
    print(f"\ncutover output gap: {gap:.2f} s from blue's commit of batch {n} to green's commit of batch "
          f"{n + 1}; {idle} trigger interval(s) of {TRIGGER_S:g} s without a commit (K={k}, N={n}, "
          f"batches 0..{last})")
