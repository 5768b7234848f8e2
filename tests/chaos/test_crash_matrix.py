"""SIGKILL of a real spark-submit driver at every fault point of the runtime, for every
sink and commit mode, then the Airflow-retry restart (same conf, ``restore=latest``):
the output is exact (no duplicate, no loss), nothing staged is left behind and no
transaction record remains. See `tests.chaos.harness` for what one trial does.

* ``test_crash_ci_subset`` (default run): one seeded trial per sink, two at a time.
* ``test_crash_trials`` (``slow``; ``make chaos``): ``SPARKPOINT_CHAOS_TRIALS`` trials
  per sink (default 50): every (commit mode, fault point) pair first, then random pairs,
  each at a random batch, chosen by ``random.Random`` from ``SPARKPOINT_CHAOS_SEED``.

``SPARKPOINT_CHAOS_WORKERS`` (default 2) trials run at once. The summary table (trials,
faults injected by kind, duplicates, rows lost, seed) is printed at the end of the run.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos.harness import (
    MODES,
    REPORTS,
    SINKS,
    STAGING_SIDES,
    DeltaAppendCase,
    DeltaMergeCase,
    S3Context,
    Trial,
    TrialResult,
    batch_for,
    chaos_seed,
    compare,
    format_report,
    plan_trials,
    points_for,
    run_trials,
)


def _workers() -> int:
    return max(1, int(os.environ.get("SPARKPOINT_CHAOS_WORKERS", "2")))


def _progress(result: TrialResult) -> None:
    state = "ok" if result.ok else "FAILED"
    fired = "fired" if result.fired else "did not fire"
    print(f"chaos {result.trial.label}: fault {fired}, {state} in {result.seconds:.0f} s", flush=True)


@pytest.mark.spark
def test_crash_ci_subset(tmp_path: Path, s3_context: S3Context) -> None:
    seed = chaos_seed()
    print(f"chaos seed {seed} (SPARKPOINT_CHAOS_SEED)")
    rng = random.Random(seed)
    trials = []
    for index, sink in enumerate(SINKS):
        mode = MODES[(index + seed) % len(MODES)]
        point = rng.choice(points_for(mode))
        trials.append(Trial(index, sink, mode, point, batch_for(point, rng), STAGING_SIDES[(index + seed) % 2]))

    results = run_trials(trials, tmp_path, s3_context, workers=_workers(), progress=_progress)

    REPORTS.append(("chaos CI subset", results, seed))
    assert all(r.ok for r in results), format_report("chaos CI subset", results, seed)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(12 * 3600)  # 50 trials take 20-40 minutes per sink on 2 cores
@pytest.mark.parametrize("sink", SINKS)
def test_crash_trials(sink: str, tmp_path: Path, s3_context: S3Context) -> None:
    seed = chaos_seed()
    count = int(os.environ.get("SPARKPOINT_CHAOS_TRIALS", "50"))
    print(f"chaos seed {seed}, {count} trials of {sink}")
    trials = plan_trials(sink, count, random.Random(f"{seed}:{sink}"))

    results = run_trials(trials, tmp_path, s3_context, workers=_workers(), progress=_progress)

    title = f"chaos trials: {sink}"
    REPORTS.append((title, results, seed))
    assert sum(r.fired for r in results) >= 0.9 * len(results), "too few faults fired: " + \
        format_report(title, results, seed)
    assert all(r.ok for r in results), format_report(title, results, seed)


def test_the_checks_see_duplicates_losses_and_wrong_rows(tmp_path: Path) -> None:
    """The harness's own negative control: what a broken sink would produce is caught."""
    rows = [{"id": i, "user": f"u{i % 3}", "amount": i + 1} for i in range(6)]
    append = DeltaAppendCase(tmp_path)
    assert compare(append, rows, list(rows)).exact
    verdict = compare(append, rows, [*rows[:4], rows[0], {**rows[1], "amount": 99}])
    assert (verdict.duplicates, verdict.lost) == (2, 2) and not verdict.exact
    merge = DeltaMergeCase(tmp_path)
    totals = [{"user": f"u{u}", "total": sum(r["amount"] for r in rows if r["user"] == f"u{u}"), "events": 2}
              for u in range(3)]
    assert compare(merge, rows, totals).exact
    twice = {**totals[0], "total": totals[0]["total"] * 2, "events": 4}
    verdict = compare(merge, rows, [twice, totals[1]])
    assert (verdict.duplicates, verdict.lost) == (2, 2) and not verdict.exact
