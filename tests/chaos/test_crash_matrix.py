"""SIGKILL of real spark-submit drivers (and commit and rollback steps) at every fault
point of the runtime, for every sink, both commit modes and both S3 servers, then the
Airflow-retry restart (same conf, ``restore=latest``): the output is exact (no
duplicate, no loss, checked against the input files), nothing staged is left behind and
no transaction record remains. A trial counts only if each of its faults fired (see
`tests.chaos.harness`). Scenarios: `tests.chaos.scenarios`; plans: `tests.chaos.plan`.

* ``test_crash_ci_subset`` (default run): the fixed CI plan, in which all 14 fault
  points of a run fire (chained faults, the double faults of recovery, rewind, abort and
  retention), and one zero-downtime cutover trial, two trials at a time.
* ``test_crash_trials`` (``slow``; ``make chaos``): ``SPARKPOINT_CHAOS_TRIALS`` trials per
  sink (default 50; a sink on S3 splits them between moto and SeaweedFS), and at least
  one per (fault point, commit mode) pair of each case: every pair must fire.
  ``SPARKPOINT_CHAOS_CASES`` (comma-separated case keys, e.g. ``directory,s3@moto``)
  narrows the cases.
* ``test_cutover_trials`` (``slow``; ``make chaos``): a zero-downtime cutover killed at
  each of its fault points and a rollback after a cutover killed at ``abort``
  (`tests.chaos.cutover`), on Delta append and merge and the S3 sink (both servers):
  every fault must fire, every output be exact.

``SPARKPOINT_CHAOS_WORKERS`` (default 2) trials run at once. The table (trials, fired,
duplicates, lost, failed per case x fault point x mode) is printed at the end.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.faults import POINTS as ALL_POINTS
from tests.chaos import cutover
from tests.chaos.cases import case_keys
from tests.chaos.harness import (
    Fault,
    Firing,
    Run,
    Trial,
    TrialResult,
    Verdict,
    chaos_seed,
    compare,
    evidence,
)
from tests.chaos.plan import (
    CUTOVER_POINTS,
    ELSEWHERE,
    POINTS,
    REPORTS,
    RUN_POINTS,
    ci_plan,
    coverage_gaps,
    cutover_trials,
    format_report,
    pairs_for,
    plan_sweep,
    trial_for,
)
from tests.chaos.scenarios import run_trials
from tests.support.s3_servers import SERVERS, S3Context

CASES = case_keys()


def _workers() -> int:
    return max(1, int(os.environ.get("SPARKPOINT_CHAOS_WORKERS", "2")))


def _progress(result: TrialResult) -> None:
    state = "ok" if result.ok else "FAILED"
    fired = "; ".join(f.describe() for f in result.firings) or "no fault armed"
    print(f"chaos {result.trial.label}: {fired}; {state} in {result.seconds:.0f} s", flush=True)
    for note in result.notes:
        print(f"    {note}", flush=True)


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(3600)
def test_crash_ci_subset(tmp_path: Path, s3_servers: dict[str, S3Context]) -> None:
    trials = ci_plan()
    armed = {p for t in trials for p in t.points}
    assert set(RUN_POINTS) <= armed, "the CI plan must arm every fault point of a run"
    assert len(armed & set(CUTOVER_POINTS)) == 1, "the CI plan runs one cutover trial (make chaos: all)"

    results = run_trials(trials, tmp_path, s3_servers, workers=_workers(), progress=_progress)

    REPORTS.append(("chaos CI subset", results, "fixed plan"))
    report = format_report("chaos CI subset", results, "fixed plan")
    unfired = sorted(armed - {p for r in results for p in POINTS if r.fired_point(p)})
    assert not unfired, f"fault points that never fired: {unfired}\n{report}"
    assert all(r.ok for r in results), report


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(24 * 3600)  # 50 trials take 20-40 minutes per case on 2 cores
@pytest.mark.parametrize("case", CASES)
def test_crash_trials(case: str, tmp_path: Path, s3_servers: dict[str, S3Context]) -> None:
    selected = [c.strip() for c in os.environ.get("SPARKPOINT_CHAOS_CASES", "").split(",") if c.strip()]
    if selected and case not in selected:
        pytest.skip(f"SPARKPOINT_CHAOS_CASES={','.join(selected)} leaves {case} out")
    seed = chaos_seed()
    per_sink = int(os.environ.get("SPARKPOINT_CHAOS_TRIALS", "50"))
    # A sink on S3 runs on both servers: its trials are split between them, and each
    # server still gets every (fault point, mode) pair.
    count = -(-per_sink // len(SERVERS)) if "@" in case else per_sink
    trials = plan_sweep(case, count, random.Random(f"{seed}:{case}"))
    print(f"chaos seed {seed}: {len(trials)} trials of {case} ({len(pairs_for(case))} pairs first)")

    results = run_trials(trials, tmp_path, s3_servers, workers=_workers(), progress=_progress)

    title = f"chaos trials: {case}"
    REPORTS.append((title, results, seed))
    gaps = coverage_gaps(results, [case])
    assert not gaps, \
        f"(fault point, mode) pairs that never fired: {gaps}\n" + format_report(title, results, seed)
    assert all(r.ok for r in results), format_report(title, results, seed)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(6 * 3600)  # 7 trials of 3-4 drivers each per case
@pytest.mark.parametrize("case", cutover.CASES)
def test_cutover_trials(case: str, tmp_path: Path, s3_servers: dict[str, S3Context]) -> None:
    """A zero-downtime cutover killed at each of its fault points on `case`; every one
    fires, every output is exact (`tests.chaos.cutover`)."""
    selected = [c.strip() for c in os.environ.get("SPARKPOINT_CHAOS_CASES", "").split(",") if c.strip()]
    if selected and case not in selected:
        pytest.skip(f"SPARKPOINT_CHAOS_CASES={','.join(selected)} leaves {case} out")
    trials = cutover_trials(case, random.Random(f"{chaos_seed()}:cutover:{case}"))

    results = run_trials(trials, tmp_path, s3_servers, workers=_workers(), progress=_progress)

    title = f"cutover trials: {case}"
    REPORTS.append((title, results, chaos_seed()))
    gaps = coverage_gaps(results, [case])
    cutover_gaps = [g for g in gaps if g.split()[1].split("/")[0] in CUTOVER_POINTS]
    assert not cutover_gaps, f"cutover points that never fired: {cutover_gaps}\n" + \
        format_report(title, results, chaos_seed())
    assert all(r.fired for r in results), format_report(title, results, chaos_seed())  # the rollback's too
    assert all(r.ok for r in results), format_report(title, results, chaos_seed())


# ---------------------------------------------------------------------------- the harness's own controls


def test_every_cutover_point_is_planned_on_its_cases_in_checkpoint_mode_only() -> None:
    """The sweep of a cutover case must fire every cutover point (checkpoint mode); the
    other cases and external mode have none; the CI plan has one cutover trial."""
    for case in CASES:
        cut = {p for p, mode in pairs_for(case) if p in CUTOVER_POINTS}
        assert cut == (set(CUTOVER_POINTS) if case in cutover.CASES else set()), case
        assert not [p for p, mode in pairs_for(case) if p in CUTOVER_POINTS and mode != "checkpoint"]
    assert set(CUTOVER_POINTS) == set(cutover.POINTS) and set(CUTOVER_POINTS) <= set(ALL_POINTS)
    trial = trial_for(0, "delta-append", "checkpoint", "cutover_agreement", random.Random(1))
    assert ((trial.scenario, trial.faults)
            == ("cutover", (Fault("cutover_agreement", cutover.AGREED, "agreement"),)))
    assert [t.points for t in ci_plan() if t.scenario == "cutover"] == [("cutover_first_commit",)]
    every = cutover_trials("s3@moto", random.Random(2))
    assert [t.faults[0] for t in every] == [*(cutover.fault_for(p) for p in CUTOVER_POINTS), cutover.ROLLBACK]
    assert {t.scenario for t in every} == {"cutover"} and len({t.index for t in every}) == len(every)



def test_pacing_arms_pause_point_stage_beside_the_run_s_own_pause_points(tmp_path: Path) -> None:
    from tests.chaos.scenarios import PAUSE_AT, PAUSE_DIR, arm_stage_pause

    alone = {"spark.sparkpoint.job": "j"}
    assert arm_stage_pause(alone, 3, tmp_path / "mine") == tmp_path / "mine"
    assert alone == {"spark.sparkpoint.job": "j", PAUSE_AT: "stage:3", PAUSE_DIR: str(tmp_path / "mine")}
    theirs = {PAUSE_AT: "recorded:2", PAUSE_DIR: str(tmp_path / "theirs")}
    assert arm_stage_pause(theirs, 3, tmp_path / "mine") == tmp_path / "theirs"
    assert theirs == {PAUSE_AT: "recorded:2,stage:3", PAUSE_DIR: str(tmp_path / "theirs")}
    with pytest.raises(ValueError, match="pacing arms pause point stage:3, but the run arms"):
        arm_stage_pause({PAUSE_AT: "recorded:2, stage:1", PAUSE_DIR: str(tmp_path)}, 3, tmp_path)
    with pytest.raises(ValueError, match="without spark.sparkpoint.test.pauseDir"):
        arm_stage_pause({PAUSE_AT: "recorded:2"}, 3, tmp_path)


@pytest.mark.parametrize("mode", ["checkpoint", "external"])
def test_pacing_releases_the_batch_after_once_its_checkpoint_is_complete_and_in_checkpoint_mode_committed(
        tmp_path: Path, mode: str) -> None:
    from types import SimpleNamespace

    from tests.chaos.scenarios import pacer

    latest: list[SimpleNamespace] = []
    records = [SimpleNamespace(batch_id=2), SimpleNamespace(batch_id=3)]
    catalog: Any = SimpleNamespace(latest=lambda: latest[-1] if latest else None,
                                   transactions=lambda: records)
    notes: list[str] = []
    poll = pacer(catalog, 2, mode, tmp_path, notes)
    latest.append(SimpleNamespace(batch_id=2))
    release = tmp_path / "stage.release"
    poll()
    assert not release.exists()  # the driver is not held yet: nothing read, nothing released
    (tmp_path / "stage.reached").write_text("{}")
    latest.clear()
    poll()
    assert not release.exists()  # no checkpoint yet
    latest.append(SimpleNamespace(batch_id=1))
    poll()
    assert not release.exists()  # an older one
    latest.append(SimpleNamespace(batch_id=2))
    poll()
    assert release.exists() == (mode == "external")  # batch 2's record is not committed yet
    records.pop(0)
    poll()
    assert release.exists() and notes == []


def test_pacing_releases_with_a_note_when_the_checkpoint_never_comes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from tests.chaos import scenarios

    monkeypatch.setattr(scenarios, "PACE_TIMEOUT_S", 0.2)
    catalog: Any = SimpleNamespace(latest=lambda: None, transactions=list)
    notes: list[str] = []
    poll = scenarios.pacer(catalog, 2, "checkpoint", tmp_path, notes)
    poll()
    time.sleep(0.3)
    poll()
    assert not (tmp_path / "stage.release").exists()  # the timeout counts from the driver's arrival
    (tmp_path / "stage.reached").write_text("{}")
    poll()
    time.sleep(0.3)
    poll()
    assert (tmp_path / "stage.release").exists()
    assert notes == [("pacing: no checkpoint of batch 2 within 0 s of the driver reaching stage:3; "
                      "released it anyway")]


def test_the_checks_see_duplicates_losses_and_wrong_rows(tmp_path: Path) -> None:
    """What a broken sink would produce is caught."""
    from tests.chaos.cases import DeltaAppendCase, DeltaMergeCase

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


def test_a_delta_commit_of_batch_0_counts_as_landed(tmp_path: Path) -> None:
    """Delta's app-transaction version 0 is batch 0 committed, not "nothing committed"
    (a kill at promoting:0 after the log entry was judged "before the promotion")."""
    from types import SimpleNamespace

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from tests.chaos.cases import JOB, DeltaMergeCase

    case = DeltaMergeCase(tmp_path)
    record = SimpleNamespace(job=JOB, batch_id=0, payload={"staged": {"files": ["a", "b", "c"],
                                                                     "staging": "x/batch-0"}})
    assert case.promotion(record) == (0, 3)  # no table yet
    write_deltalake(case.output(), pa.table({"user": ["u0"], "total": [1], "events": [1]}),
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id=JOB, version=0)]))
    assert case.promotion(record) == (3, 3)
    assert case.promotion(SimpleNamespace(**{**vars(record), "batch_id": 1})) == (0, 3)


def _run(tmp_path: Path, name: str, returncode: int, output: str) -> Run:
    log = tmp_path / f"{name}.log"
    log.write_text(output)
    return Run(returncode, log, 1.0)


def test_evidence_needs_the_marker_the_sigkill_and_the_kill_line(tmp_path: Path) -> None:
    """Each of the three proofs is required, and only the armed point and batch count."""
    fault = Fault("copy", 2)
    marker = tmp_path / "fault-1-copy"
    line = "SPARKPOINT_TEST_FAULT: killing driver at copy:2\n"
    marker.write_text("copy:2\n")
    assert evidence(fault, _run(tmp_path, "a", -9, line), marker).fired
    assert not evidence(fault, _run(tmp_path, "b", 0, line), marker).fired, "a clean exit is no kill"
    assert not evidence(fault, _run(tmp_path, "c", 1, line), marker).fired, "a failure is no kill"
    assert not evidence(fault, _run(tmp_path, "d", -9, "killed by the harness"), marker).fired
    assert not evidence(Fault("copy", 1), _run(tmp_path, "e", -9, line), marker).fired, "another batch"
    timed_out = _run(tmp_path, "f", -9, line)
    timed_out.timed_out = True
    assert not evidence(fault, timed_out, marker).fired, "the harness's timeout kill is no fault"
    marker.unlink()
    firing = evidence(fault, _run(tmp_path, "g", -9, line), marker)
    assert not firing.fired and "no once-marker" in firing.describe()


def test_a_trial_whose_fault_never_fires_is_failed(tmp_path: Path) -> None:
    """Exact output and no problem, but the fault's evidence is missing: FAILED, and
    counted as not fired in the table and in the coverage check."""
    trial = Trial(0, "directory", "checkpoint", "crash", (Fault("copy", 1),))
    clean = Firing(Fault("copy", 1), "try1.log", marker=False, sigkill=False, line=False)
    result = TrialResult(trial, firings=[clean], verdict=Verdict())
    assert result.verdict.exact and not result.problems
    assert not result.fired and not result.ok
    assert "fault copy:1 did NOT fire in try1.log" in result.failures()[0]
    assert "FAILED #0 directory/checkpoint crash: copy:1" in format_report("t", [result], 1)
    assert "directory copy/checkpoint" in coverage_gaps([result], ["directory"])
    # a chained trial fails when any one of its faults did not fire
    chained = Trial(1, "directory", "checkpoint", "crash", (Fault("stage", 0), Fault("copy", 1)))
    fired = Firing(Fault("stage", 0), "try1.log", marker=True, sigkill=True, line=True)
    assert not TrialResult(chained, firings=[fired, clean]).ok
    assert not TrialResult(chained, firings=[fired]).ok, "a fault never armed did not fire"
    assert TrialResult(chained, firings=[fired, Firing(Fault("copy", 1), "try2.log", True, True, True)]).ok


@pytest.mark.spark
@pytest.mark.timeout(900)
# slow (23 s): the rule (an unfired trial is failed) is tested without Spark above
# (test_a_trial_whose_fault_never_fires_is_failed); `make chaos` / `make test-all` run it
@pytest.mark.slow
def test_a_real_trial_with_a_fault_point_that_is_never_reached_is_failed(tmp_path: Path) -> None:
    """The whole harness, with real drivers: a fault armed at a batch the job never runs
    (as if its fault point had been deleted from the code) leaves exact output, and the
    trial is reported FAILED, not fired."""
    from tests.chaos.scenarios import run_trial

    trial = Trial(0, "directory", "checkpoint", "crash", (Fault("copy", 99),))
    result = run_trial(trial, tmp_path / "t", {})
    assert result.verdict.exact and not result.problems, result.failures()
    assert not result.fired and not result.ok
    assert [f.describe() for f in result.firings] == [
        "fault copy:99 did NOT fire in try1.log (no once-marker, no SIGKILL exit, no kill line)"]


def test_every_fault_point_is_wired_into_the_code() -> None:
    """A fast guard next to the evidence rule: each point of `faults.POINTS` appears in a
    `faults.maybe_kill*` / `map_in_halves` call of the package (the CI plan then proves it
    is reached)."""
    import re

    import airflow_sparkpoint

    package = Path(airflow_sparkpoint.__file__).parent
    calls = re.compile(r"faults\.(?:maybe_kill|maybe_kill_halfway|map_in_halves)\((?:[^()]|\([^()]*\))*\)",
                       re.DOTALL)
    wired: set[str] = set()
    for source in package.rglob("*.py"):
        for call in calls.findall(source.read_text()):
            wired.update(re.findall(r'"([a-z_]+)"', call))
    assert set(ALL_POINTS) <= wired, f"fault points not called anywhere: {sorted(set(ALL_POINTS) - wired)}"


def test_fault_points_outside_the_chaos_job_are_armed_and_proved_by_their_tests() -> None:
    """Every fault point is either in the chaos plan or armed by a named test that asserts
    its once-marker (the evidence rule holds there too)."""
    root = Path(__file__).resolve().parents[2]
    assert set(ALL_POINTS) == set(POINTS) | set(ELSEWHERE)
    for point, test in ELSEWHERE.items():
        text = (root / test).read_text()
        assert f'"SPARKPOINT_TEST_FAULT": f"{point}:' in text, f"{test} does not arm {point}"
        assert f'== f"{point}:' in text, f"{test} does not assert that {point} fired"


def test_a_folded_source_batch_is_recognised(tmp_path: Path) -> None:
    """The diagnosis `run_trials` adds to a failed trial: a live location whose
    ``offsets/2`` names source-log batch 3 is a fold; the shared copies of a checkpoint are
    not looked at."""
    from tests.chaos.scenarios import spark_folded

    live = tmp_path / "checkpoints" / "chaos" / "live" / "g1" / "offsets"
    live.mkdir(parents=True)
    for batch, log_offset in ((0, 0), (1, 1)):
        (live / str(batch)).write_text('v1\n{"batchWatermarkMs":0}\n' + json.dumps({"logOffset": log_offset}))
    assert spark_folded(tmp_path) == []
    (live / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}\n')
    assert spark_folded(tmp_path) == ["checkpoints/chaos/live/g1/offsets/2 = {'0': 3}"]


def test_no_planned_fault_waits_for_a_batch_number_a_fold_can_remove() -> None:
    """A kill after Spark confirmed batch N can leave batch N+1's source-log entry without
    its offsets entry; the restart then folds two input files into one batch and batch
    `LAST` never comes. No trial of the CI plan or of a sweep arms a later fault there (the
    CI plan did, and its ``stopped:3`` did not fire in about half the runs)."""
    from tests.chaos.plan import LAST, fold_hazards

    old = Trial(6, "directory-s3@moto", "external", "crash",
                (Fault("checkpointed", 1), Fault("promoting", 2, "commit"), Fault("stopped", LAST)))
    assert fold_hazards(old) == [f"stopped:{LAST} after checkpointed:1"]
    assert fold_hazards(Trial(0, "directory", "checkpoint", "crash",
                              (Fault("stage", 1), Fault("promoting", LAST)))) \
        == [], "a kill before commits/1 cannot fold"
    planned = list(ci_plan())
    for seed in range(20):
        rng = random.Random(seed)
        for case in CASES:
            planned += plan_sweep(case, 30, rng)
    assert [(t.label, fold_hazards(t)) for t in planned if fold_hazards(t)] == []


def test_a_stop_waits_for_the_last_input_not_a_batch_number_a_fold_removed(tmp_path: Path) -> None:
    """`_drained`: a run whose batch 2 covers source-log batches 2 and 3 (Spark folded them
    after a kill) has drained 4 input files although batch 3 never comes; a run at batch 2
    without the fold, or whose batch 2 is not committed yet, has not."""
    from tests.chaos.scenarios import _drained

    live = tmp_path / "live"
    (live / "offsets").mkdir(parents=True)
    (live / "commits").mkdir()
    (live / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":2}')
    status = {"last_batch": 2, "live_dir": str(live)}
    assert not _drained(status, 3), "batch 2 is not committed"
    (live / "commits" / "2").write_text("v1\n{}")
    assert not _drained(status, 3), "no fold: batch 3 is still to come"
    (live / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}')
    assert _drained(status, 3), "batch 2 covers the last input file"
    assert _drained({"last_batch": 3, "live_dir": None}, 3)
    assert not _drained({"last_batch": None}, 3)
