"""The output gap of a deploy (zero-downtime blue-green, issue 49): the zero-downtime
cutover next to today's stop-savepoint-start, in the same run, on the same machine.

Both deploys start from the same blue (per-user totals, ``processingTime`` 1 s, Delta
append, its own ``spark-submit``) while input arrives every ``--pace`` seconds; the
input past the deploy's batch is there at once (a backlog), so the gap is the deploy's,
not the input's. The cutover runs twice:

- **steady** (the goal's case): the input keeps its pace through the agreed batch N
  (green, following blue batch by batch, keeps up), and only the input past N is there
  at once;
- **burst**: from the agreement on, the input of every batch through N + 4 is there at
  once, so blue runs through N at its trigger's pace while green follows at its own
  (a query start per replayed batch): green's lag at blue's stop adds to the gap.

- **cutover**: `tests/support/cutover_run.run_cutover` (green warms up in this process
  as the cutover's shadow; blue stops exactly after the agreed N and takes its final
  savepoint of N; green claims the job and commits N+1); blue's share of the gap (its
  commit of N to its request's completion) and its final savepoint's copy are printed;
- **restart**: stop-with-savepoint (`services.savepoint.take_savepoint`), then green's
  own ``spark-submit`` restoring the savepoint (JVM start, restore, first batch, commit).

Gap: the Delta history's timestamp of green's first commit minus blue's last one; trigger
intervals without a commit: ceil(gap / trigger) - 1. Goal (issue 49): the cutover's gap
at most 2 trigger intervals and at most 0.2 x the restart's. Prints, never asserts time.

The cost of the second driver (issue 49), per deploy: how long green's driver runs beside
blue (from green's start to blue's exit: the warm-up and the handover) and its CPU
seconds in that time, read from ``/proc``: this process's own (green's Python side, plus
the orchestrator's polling and the input feeder, both small) and its Spark JVM's with
that JVM's descendants (blue is its own ``spark-submit``, not counted); and green's CPU
over its whole run (until the orchestrator stops it, a few batches after N).

    .venv/bin/python benchmarks/bench_cutover_gap.py [--pace 2.5] [--json]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from _bench import emit, spark_session

GOAL_INTERVALS = 2
GOAL_RATIO = 0.2
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, list[str]] | None:
    """(parent pid, fields after the command name) of /proc/<pid>/stat, or None (gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields


def _cpu(fields: list[str], *, reaped_children: bool) -> float:
    """utime + stime (+ the reaped children's cutime + cstime) in seconds."""
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5), counted from state
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of process `root` and every live descendant (with what each reaped)."""
    parents: dict[int, list[tuple[int, list[str]]]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _proc_stat(int(entry))
            if found is not None:
                parents.setdefault(found[0], []).append((int(entry), found[1]))
                stats[int(entry)] = found[1]
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += _cpu(stats[pid], reaped_children=True)
        todo += [child for child, _fields in parents.get(pid, ())]
    return total


def green_cpu_probe(spark: Any) -> Any:
    """A probe of green's CPU seconds so far: this process's own (not its children's: blue's
    spark-submit is one) and its Spark JVM's tree."""
    jvm = spark.sparkContext._gateway.proc.pid

    def probe() -> float:
        own = _proc_stat(os.getpid())
        return (_cpu(own[1], reaped_children=False) if own else 0.0) + tree_cpu_seconds(jvm)

    return probe


def second_driver(marks: dict[str, tuple[float, Any]]) -> dict[str, float]:
    """The second driver's cost from `CutoverRun.marks`: seconds beside blue and CPU then,
    and until green's end."""
    (start, cpu0), (blue_exit, cpu1) = marks["green_start"], marks["blue_exit"]
    end, cpu2 = marks["green_end"]
    beside = blue_exit - start
    return {"beside_blue_s": beside, "cpu_beside_blue_s": cpu1 - cpu0,
            "cores_beside_blue": (cpu1 - cpu0) / beside if beside > 0 else 0.0,
            "green_run_s": end - start, "green_cpu_s": cpu2 - cpu0}


def blue_stop(run: Any) -> dict[str, Any]:
    """Blue's share of the cutover's gap: from its commit of N (the table's history) to its
    stop_after request's completion, and, inside it, its final savepoint of N (the copy of
    its final checkpoint: the savepoint's own duration and size)."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    catalog = run.catalog
    result = ControlChannel(catalog).result(run.stop_request)
    at = {c["batch"]: c["timestamp"] for c in run.commits}
    found: dict[str, Any] = {"commit_to_completed_s": result.updated_at - at[run.n] / 1000.0,
                             "savepoint": result.savepoint, "savepoint_s": None, "savepoint_bytes": None}
    handle = catalog.own_snapshot(result.savepoint) if result.savepoint else None
    if handle is not None:
        found["savepoint_s"] = handle.metadata.stats.duration_ms / 1000.0
        found["savepoint_bytes"] = handle.metadata.stats.bytes_copied
        found["savepoint_files"] = handle.metadata.stats.files_copied
    return found


def restart_gap(base: Path, pace_s: float, *, warm_batches: int = 6, after: int = 4,
                timeout_s: float = 300.0) -> dict[str, Any]:
    """Today's path: blue runs `warm_batches`, stop-with-savepoint, green's spark-submit
    from the savepoint drains `after` more batches (``availableNow``); the gap."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.services.savepoint import take_savepoint
    from tests.support.cutover_run import JOB, TRIGGER_S, Feeder, blue_conf, sparkpoint_commits
    from tests.support.shadow_totals import JOB_SCRIPT
    from tests.support.submit import spark_submit_command, start_spark_submit, submit_env
    from tests.support.waits import wait_for

    root, inputs, output = base / "checkpoints", base / "input", base / "output"
    inputs.mkdir(parents=True, exist_ok=True)
    args = ["--input", str(inputs), "--output", str(output), "--sink", "delta"]
    env = submit_env()
    feeder = Feeder(inputs, pace_s)
    feeder.start(2)
    blue = start_spark_submit(spark_submit_command(JOB_SCRIPT, blue_conf(root), args, env=env), env=env,
                              log=base / "blue.log")
    green = None
    try:
        catalog = Catalog.open(str(root), JOB)
        wait_for(f"blue's batch {warm_batches}",
                 lambda: ((catalog.read_status() or {}).get("last_batch") or -1) >= warm_batches, timeout_s,
                 proc=blue)
        deployed = time.time()
        savepoint = take_savepoint(catalog, stop=True, timeout_s=timeout_s, poll_s=0.2,
                                   max_heartbeat_age=60.0, requested_by="bench_cutover_gap", wait=False)
        last_blue = int((catalog.read_status() or {}).get("last_batch") or 0)
        feeder.rush(last_blue + 2 + after)
        blue_exit = blue.wait(timeout_s)
        from airflow_sparkpoint.checkpoints.control import ControlChannel

        result = ControlChannel(catalog).result(savepoint.request_id or "")
        if blue_exit != 0 or result.state != "completed" or not result.savepoint:
            raise RuntimeError(f"blue's stop-with-savepoint: exit {blue_exit}, {result.state}: "
                               f"{result.error}")
        conf = {**blue_conf(root), "spark.sparkpoint.trigger": "availableNow",
                "spark.sparkpoint.restore": result.savepoint}
        green = start_spark_submit(spark_submit_command(JOB_SCRIPT, conf, args, env=env), env=env,
                                   log=base / "green.log")
        green_exit = green.wait(timeout_s)
        if green_exit != 0:
            raise RuntimeError(f"green's spark-submit exited {green_exit}; see {base / 'green.log'}")
        commits = sparkpoint_commits(output)
        n = int(result.batch_id or 0)
        at = {c["batch"]: c["timestamp"] for c in commits}
        gap = (at[n + 1] - at[n]) / 1000.0
        return {"gap_s": gap, "idle_intervals": max(0, math.ceil(gap / TRIGGER_S) - 1), "n": n,
                "deploy_s": time.time() - deployed, "batches": len(commits)}
    finally:
        feeder.rush(-1)
        for proc in (blue, green):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pace", type=float, default=2.5, help="seconds between input files (default 2.5)")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    from tests.support.cutover_run import TRIGGER_S, commit_gap, run_cutover

    spark = spark_session("bench-cutover-gap")
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        started = time.perf_counter()
        run = run_cutover(spark, Path(tmp) / "cutover", pace_s=opts.pace, probe=green_cpu_probe(spark),
                          burst=False)
        if run.blue_exit != 0 or run.green_error is not None:
            raise SystemExit(f"the cutover failed: blue exit {run.blue_exit}, green {run.green_error!r}")
        cutover_s = time.perf_counter() - started
        gap, idle = commit_gap(run.commits, run.n)
        cost = second_driver(run.marks)
        stop = blue_stop(run)
        burst_run = run_cutover(spark, Path(tmp) / "burst", pace_s=opts.pace, burst=True)
        if burst_run.blue_exit != 0 or burst_run.green_error is not None:
            raise SystemExit(f"the burst cutover failed: blue exit {burst_run.blue_exit}, green "
                             f"{burst_run.green_error!r}")
        burst_gap, burst_idle = commit_gap(burst_run.commits, burst_run.n)
        restart = restart_gap(Path(tmp) / "restart", opts.pace)
    ratio = gap / restart["gap_s"] if restart["gap_s"] > 0 else math.inf
    ok = idle <= GOAL_INTERVALS and ratio <= GOAL_RATIO
    result = {
        "benchmark": "cutover_gap", "trigger_s": TRIGGER_S, "pace_s": opts.pace,
        "cutover": {"gap_s": gap, "idle_intervals": idle, "k": run.k, "n": run.n, "run_s": cutover_s},
        "cutover_burst": {"gap_s": burst_gap, "idle_intervals": burst_idle, "k": burst_run.k,
                          "n": burst_run.n},
        "second_driver": cost, "blue_stop": stop,
        "restart": restart, "ratio": ratio, "goal": {"idle_intervals": GOAL_INTERVALS, "ratio": GOAL_RATIO},
        "pass": ok,
        "summary": f"cutover gap {gap:.2f} s ({idle} idle trigger intervals) vs stop-savepoint-start "
                   f"{restart['gap_s']:.2f} s ({restart['idle_intervals']}): ratio {ratio:.2f} "
                   f"(goal <= {GOAL_RATIO}, <= {GOAL_INTERVALS} intervals); burst {burst_gap:.2f} s "
                   f"({burst_idle})",
    }
    emit(result, opts.json, [
        (f"zero-downtime cutover, steady input: gap {gap:.2f} s, {idle} trigger interval(s) of "
         f"{TRIGGER_S:g} s "
         f"without a commit (K={run.k}, N={run.n}; whole run {cutover_s:.0f} s, green's warm-up included)"),
        (f"zero-downtime cutover, burst to N: gap {burst_gap:.2f} s, {burst_idle} interval(s) "
         f"(K={burst_run.k}, N={burst_run.n})"),
        (f"stop-savepoint-start:  gap {restart['gap_s']:.2f} s, {restart['idle_intervals']} interval(s) "
         f"(N={restart['n']})"),
        f"ratio cutover (steady) / restart: {ratio:.3f}",
        (f"blue's stop after N: its commit of N to the request's completion "
         f"{stop['commit_to_completed_s']:.2f} s, of which its final savepoint of N "
         + (f"{stop['savepoint_s']:.2f} s ({stop['savepoint_files']} files, {stop['savepoint_bytes']} bytes)"
            if stop["savepoint_s"] is not None else "none (a blue that took none)")),
        (f"second driver per deploy: green ran {cost['beside_blue_s']:.1f} s beside blue "
         f"(its start to blue's exit), using {cost['cpu_beside_blue_s']:.1f} CPU s "
         f"({cost['cores_beside_blue']:.2f} cores); "
         f"{cost['green_cpu_s']:.1f} CPU s in its whole run of {cost['green_run_s']:.1f} s"),
    ])


if __name__ == "__main__":
    main()
