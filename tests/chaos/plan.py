"""Which trials run: the deterministic CI plan (every fault point fires at least once),
the randomized sweep of ``make chaos`` (every fault point x commit mode pair of each
case first, then random ones), the coverage check and the summary table."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from airflow_sparkpoint.faults import POINTS as ALL_POINTS
from tests.chaos import cutover
from tests.chaos.cases import split_key
from tests.chaos.harness import BATCHES, MODES, STAGING_SIDES, Fault, Trial, TrialResult
from tests.chaos.scenarios import STOP_POINTS

LAST = BATCHES - 1
#: driver fault points reached after Spark wrote ``commits/N``: Spark may be planning batch
#: N+1 already, and a kill between its source-log entry and its ``offsets`` entry makes the
#: restart fold input files N+1 and N+2 into batch N+1 (`runtime.livedir.source_log_ends`),
#: so every later batch number shifts down by one and batch `LAST` may never come. Only a
#: restart that resumes the killed run's live location folds (after ``checkpointed``,
#: ``retention``, ``promoting``/``committed``; a kill before checkpoint N completes restarts
#: from a location materialized from N-1, without the entry): deliberately more than that
AFTER_CONFIRM = ("confirmed", "copy", "metadata", "checkpointed", "promoting", "committed", "retention")
#: fault points the chaos job cannot reach, each proved (its once-marker asserted) by the
#: test named here: the rescale needs RocksDB state and ``restore.statePartitions``.
ELSEWHERE = {"rescale": "tests/integration/test_rescale.py"}
#: the fault points of the chaos trials
POINTS = tuple(p for p in ALL_POINTS if p not in ELSEWHERE)
#: the zero-downtime cutover's (`tests.chaos.cutover`): blue, green and the agreement of
#: one cutover, on the cases of `cutover.CASES`, in ``checkpoint`` commit mode only
CUTOVER_POINTS = tuple(cutover.POINTS)
#: the fault points of one run (the ``crash``, ``rewind``, ... scenarios)
RUN_POINTS = tuple(p for p in POINTS if p not in CUTOVER_POINTS)
#: the cutover trial of the CI plan (one: each is three or four drivers, two at once)
CI_CUTOVER = "cutover_first_commit"
#: (title, results, seed) of every trial run in this session, printed at its end (conftest)
REPORTS: list[tuple[str, list[TrialResult], Any]] = []


def points_for(case: str, mode: str) -> tuple[str, ...]:
    """Fault points that exist for `case` in `mode`: the job never commits in ``external``
    mode (there ``promoting`` fires in the commit step); only Delta can be rewound; a
    cutover runs in ``checkpoint`` mode (blue's stop after N commits N itself) on the
    cases of `cutover.CASES`."""
    case_cls, _server = split_key(case)
    run = tuple(p for p in RUN_POINTS
                if not (mode == "external" and p == "committed")
                and not (p == "rewind" and not case_cls.delta))
    return run + (CUTOVER_POINTS if mode == "checkpoint" and case in cutover.CASES else ())


def pairs_for(case: str) -> list[tuple[str, str]]:
    """Every (fault point, commit mode) pair a full sweep of `case` must fire."""
    return [(point, mode) for mode in MODES for point in points_for(case, mode)]


def trial_for(index: int, case: str, mode: str, point: str, rng: random.Random, *,
              rollback: bool = False) -> Trial:
    """One trial whose scenario fires `point` (see `tests.chaos.scenarios`)."""
    staging = rng.choice(STAGING_SIDES)
    if point in CUTOVER_POINTS:
        return Trial(index, case, mode, "cutover", (cutover.fault_for(point),), staging)
    if point == "recovery":  # a double fault: a kill leaving a record, then a kill during its recovery
        batch = rng.randrange(BATCHES)
        first = Fault(rng.choice(("record", "confirmed")), batch)
        return Trial(index, case, mode, "crash", (first, Fault("recovery", batch)), staging)
    if point == "rewind":
        return Trial(index, case, mode, "rewind", (Fault("rewind", None),), staging)
    if point == "retention":
        return Trial(index, case, mode, "retention", (Fault("retention", BATCHES),), staging)
    if point == "abort":
        if mode == "external" and rollback:
            return Trial(index, case, mode, "rollback", (Fault("abort", 2, "rollback"), Fault("stage", 2)),
                         staging)
        return Trial(index, case, mode, "stop-abort", (Fault("abort", LAST),), staging)
    batch = LAST if point in STOP_POINTS else rng.randrange(BATCHES)
    where = "commit" if point == "promoting" and mode == "external" else "job"
    return Trial(index, case, mode, "crash", (Fault(point, batch, where),), staging)


def cutover_trials(case: str, rng: random.Random, start_index: int = 0) -> list[Trial]:
    """A cutover trial of `case` at each cutover point, and the rollback after a cutover."""
    trials = [trial_for(start_index + i, case, "checkpoint", point, rng)
              for i, point in enumerate(CUTOVER_POINTS)]
    return [*trials, Trial(start_index + len(trials), case, "checkpoint", "cutover", (cutover.ROLLBACK,),
                           rng.choice(STAGING_SIDES))]


def plan_sweep(case: str, count: int, rng: random.Random, start_index: int = 0) -> list[Trial]:
    """`count` trials of `case`: every (fault point, mode) pair once first, in seeded random
    order (all of them whatever `count` is), then random pairs."""
    pairs = pairs_for(case)
    rng.shuffle(pairs)
    trials = []
    for i in range(max(count, len(pairs))):
        if i < len(pairs):
            point, mode = pairs[i]
            rollback = True  # the first external abort trial of a case is the rollback
        else:
            mode = rng.choice(MODES)
            point = rng.choice(points_for(case, mode))
            rollback = rng.random() < 0.5
        trials.append(trial_for(start_index + i, case, mode, point, rng, rollback=rollback))
    return trials


def ci_plan() -> list[Trial]:
    """The default run's trials, fixed: all 14 fault points of a run fire (several chained
    in one trial, each in its own driver), on every sink, both commit modes and both S3
    servers; and one cutover trial (`CI_CUTOVER`; ``make chaos`` runs every cutover point)."""
    f = Fault
    return [
        # stage, confirmed, then recovery (a kill during the recovery of the confirmed
        # batch), then a promotion killed after its Delta log entry
        Trial(0, "delta-merge", "checkpoint", "crash",
              (f("stage", 1), f("confirmed", 2), f("recovery", 2), f("promoting", 3)), "executors"),
        # a rollback killed halfway through abort_generation, then blue's restore killed at stage
        Trial(1, "delta-append", "external", "rollback", (f("abort", 2, "rollback"), f("stage", 2)),
              "executors"),
        # restore an older checkpoint with sinkAhead=rewind, killed before its first checkpoint
        Trial(2, "delta-s3@seaweedfs", "checkpoint", "rewind", (f("rewind", None),), "driver"),
        Trial(3, "s3@moto", "external", "crash", (f("record", 1), f("promoting", 2, "commit"))),
        Trial(4, "directory", "checkpoint", "crash", (f("copy", 1), f("promoting", 2))),
        Trial(5, "catalog-s3@seaweedfs", "checkpoint", "crash", (f("metadata", 2), f("committed", LAST),
                                                                  f("savepoint", LAST))),
        Trial(6, "directory-s3@moto", "external", "crash",
              (f("checkpointed", 2), f("promoting", LAST, "commit"), f("stopped", LAST))),
        Trial(7, "delta-append", "checkpoint", "retention", (f("retention", BATCHES),), "driver"),
        Trial(8, "s3@seaweedfs", "checkpoint", "stop-abort", (f("abort", LAST),)),
        # green killed right after its first commit into blue's table; restarted as the job's
        Trial(9, "delta-merge", "checkpoint", "cutover", (cutover.fault_for(CI_CUTOVER),), "driver"),
    ]


def fold_hazards(trial: Trial) -> list[str]:
    """The faults of `trial` that may never fire because an earlier fault of the same trial
    can make Spark fold two input files into one batch (see `AFTER_CONFIRM`): a later fault
    at a batch above N+1, after a driver kill at N that leaves two or more files to read."""
    hazards = []
    for i, first in enumerate(trial.faults):
        if first.where != "job" or first.point not in AFTER_CONFIRM or first.batch is None \
                or first.batch + 2 > LAST:
            continue
        hazards += [f"{later} after {first}" for later in trial.faults[i + 1:]
                    if later.batch is None or later.batch > first.batch + 1]
    return hazards


def coverage_gaps(results: Sequence[TrialResult], cases: Sequence[str]) -> list[str]:
    """The (case, point, mode) triples that a sweep of `cases` planned but never fired."""
    gaps = []
    for case in cases:
        for point, mode in pairs_for(case):
            mine = [r for r in results if r.trial.case == case and r.trial.mode == mode]
            if not any(r.fired_point(point) for r in mine):
                gaps.append(f"{case} {point}/{mode}")
    return gaps


def format_report(title: str, results: Sequence[TrialResult], seed: Any) -> str:
    """The summary table: per case x fault point x commit mode, the trials that armed the
    point, how many of them it fired in, the duplicated and lost rows and failed trials."""
    header = ["case", "point", "mode", "trials", "fired", "duplicates", "lost", "failed"]
    rows: list[list[str]] = []
    cases = list(dict.fromkeys(r.trial.case for r in results))
    for case in cases:
        mine = [r for r in results if r.trial.case == case]
        for point in POINTS:
            for mode in MODES:
                armed = [r for r in mine if r.trial.mode == mode and point in r.trial.points]
                if not armed:
                    continue
                rows.append([case, point, mode, str(len(armed)),
                             str(sum(r.fired_point(point) for r in armed)),
                             str(sum(r.verdict.duplicates for r in armed)),
                             str(sum(r.verdict.lost for r in armed)), str(sum(not r.ok for r in armed))])
        rows.append([case, "(all)", "", str(len(mine)), str(sum(r.fired for r in mine)),
                     str(sum(r.verdict.duplicates for r in mine)), str(sum(r.verdict.lost for r in mine)),
                     str(sum(not r.ok for r in mine))])
    rows.append(["total", "", "", str(len(results)), str(sum(r.fired for r in results)),
                 str(sum(r.verdict.duplicates for r in results)), str(sum(r.verdict.lost for r in results)),
                 str(sum(not r.ok for r in results))])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [(f"{title} (seed {seed}; SPARKPOINT_CHAOS_SEED={seed} reproduces it; 'fired' of (all): trials "
              "whose every fault fired)"),
             "  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in rows]
    if results:
        seconds = sorted(r.seconds for r in results)
        lines.append(f"wall time per trial: median {seconds[len(seconds) // 2]:.0f} s, "
                     f"max {seconds[-1]:.0f} s")
    for r in results:
        if not r.ok:
            lines.append(f"FAILED {r.trial.label}: " + "; ".join(r.failures())[:2500])
    return "\n".join(lines)
