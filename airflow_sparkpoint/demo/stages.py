"""The guided demo's stages, record and verdict (``make demo`` / ``sparkpoint demo``).

Airflow (``dag.test``, SQLite metadata database), local Spark through real
``spark-submit`` and local storage, all under ``--workdir``:

1. incremental ETL (``example_sparkpoint_quickstart``): the first try's driver is killed
   with SIGKILL after a few micro-batches; Airflow's retry resumes from the latest
   retained checkpoint instead of starting over.
2. blue-green deploy (``example_sparkpoint_blue_green``) of a running job, blue, started
   as its own ``spark-submit``: green fails after its first batch, its staged output is
   aborted and blue is restored from the same savepoint.
3. the same deploy with a healthy green, promoted by the two-phase commit.

Then the record (checkpoint history, savepoints, generation switches, Delta table
history) and an exactly-once verdict computed from the tables. Airflow's and Spark's own
output goes to ``<workdir>/logs/``. Exit code 0 iff every check passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from airflow_sparkpoint.demo.console import Check, Console, Watcher, gist, verdict_lines
from airflow_sparkpoint.demo.record import (
    checkpoint_table,
    delta_history_table,
    format_table,
    generation_table,
    savepoint_table,
    snapshot_key,
    summary_lines,
)
from airflow_sparkpoint.demo.support import (
    SubmittedJob,
    delta_commits,
    delta_history,
    delta_rows,
    orphaned_staged_files,
    write_batch_file,
)
from airflow_sparkpoint.services.history import load_history, read_generation, short_name, snapshot_records
from airflow_sparkpoint.services.stores import job_catalog

__all__ = ["BATCHES", "BLUE_AGAIN_INPUT", "BLUE_BACKLOG", "BLUE_JOB", "BLUE_TRIGGER", "FAILING_GREEN_INPUT",
           "GREEN_FAILS_AFTER", "HEALTHY_GREEN_INPUT", "KILL_AFTER", "USERS", "Demo", "batch_of",
           "expected_totals"]

# Stage 1: the quickstart's input and the injected failure.
BATCHES = 8
USERS = 4
KILL_AFTER = 3
# Stages 2 and 3: input of the blue-green job, one file per micro-batch except blue's
# backlog; (users, code version expected to write their totals). Blue's trigger fires
# once at start and then not for weeks, so which version reads which file is decided by
# the order of the demo's steps, not by timing.
BLUE_JOB = "demo_totals"
BLUE_TRIGGER = "processingTime:1000h"
BLUE_BACKLOG = [("u0", "u1", "u2"), ("u0", "u1", "u2")]
FAILING_GREEN_INPUT = [("u1", "u2", "u3"), ("u1", "u3"), ("u2", "u3")]
BLUE_AGAIN_INPUT = [("u0", "u4")]
HEALTHY_GREEN_INPUT = [("u1", "u4"), ("u0", "u2", "u4"), ("u3", "u4")]
GREEN_FAILS_AFTER = 1  # green stages batch 1, then raises in batch 2


def batch_of(file_index: int) -> int:
    """The micro-batch of the blue-green job that reads input file `file_index`."""
    return max(0, file_index - len(BLUE_BACKLOG) + 1)


def expected_totals(files: Sequence[tuple[Sequence[str], int]]) -> dict[str, tuple[int, int, int]]:
    """(total, events, code_version) by user after every file, file i holding one event
    per user with amount ``i * 10 + <user number>``, written by the given code version."""
    totals: dict[str, tuple[int, int, int]] = {}
    for index, (users, version) in enumerate(files):
        for row in _totals_rows(index, users):
            total, count, _ = totals.get(row["user"], (0, 0, version))
            totals[row["user"]] = (total + row["amount"], count + 1, version)
    return totals


def _totals_rows(index: int, users: Sequence[str]) -> list[dict[str, Any]]:
    return [{"user": user, "amount": index * 10 + int(user[1:])} for user in users]


class Demo:
    """The three stages, their reports and the verdict."""

    def __init__(self, workdir: Path, dags: Path, console: Console) -> None:
        self.workdir = workdir
        self.dags = dags
        self.say = console.say
        self.console = console
        self.watcher = Watcher(console)
        self.t0 = time.time()
        self.checks: list[Check] = []
        self.blue = SubmittedJob(workdir / "blue-green", dags / "jobs" / "keyed_totals.py", BLUE_JOB,
                                 BLUE_TRIGGER, ["--version", "1", "--files-per-batch", "100"])
        self.plan: list[tuple[Sequence[str], int]] = []  # blue-green input: (users, expected code version)

    def run(self) -> int:
        """All stages, the record and the verdict; returns the exit code (0: all checks passed).

        :raises RuntimeError: a DAG did not load, or blue's process exited unexpectedly.
        :raises TimeoutError: blue did not reach a checkpoint in time.
        """
        self.start_blue()  # its start-up overlaps stage 1
        assert self.blue.proc is not None
        self.say("\n   starting blue (keyed_totals.py v1) as its own spark-submit, "
                 f"pid {self.blue.proc.pid}; "
                 "preparing Airflow (SQLite metadata database)")
        from airflow.utils import db

        db.resetdb()
        self.watcher.start()
        self.quickstart()
        self.failing_green()
        self.healthy_green()
        self.record()
        return self.verdict()

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(what, ok, detail))
        return ok

    # ------------------------------------------------------------------ plumbing

    def write_input(self, files: Sequence[Sequence[str]], version: int) -> tuple[int, int]:
        """Append files to the blue-green input; returns the (first, last) file index."""
        first = len(self.plan)
        for users in files:
            write_batch_file(self.blue.input, len(self.plan), _totals_rows(len(self.plan), users))
            self.plan.append((users, version))
        return first, len(self.plan) - 1

    def run_dag(self, dag_id: str, conf: dict[str, Any]) -> tuple[Any, dict[str, str]]:
        """`dag.test()` one run of a freshly parsed DAG (a run's conf is merged into the
        params of the DAG object it ran), with every task's start and end printed; returns
        the run and its task states.

        :raises RuntimeError: the DAG did not load.
        """
        from airflow.dag_processing.dagbag import DagBag

        dag = DagBag(str(self.dags / f"{dag_id}.py")).get_dag(dag_id)
        if dag is None:
            raise RuntimeError(f"DAG {dag_id} did not load from {self.dags}; see {self.workdir / 'logs'}")
        progress, watcher = self.console.progress, self.watcher

        def running(context: Any) -> None:
            ti = context["ti"]
            watcher.task = (ti.task_id, time.monotonic())
            progress(f"task {ti.task_id}: running (try {ti.try_number})")

        def ended(how: str) -> Any:
            def callback(context: Any) -> None:
                watcher.task = None
                error = context.get("exception")
                progress(f"task {context['ti'].task_id}: {how}" + (f": {gist(str(error))}" if error else ""))
            return callback

        succeeded, failed, retried = ended("success"), ended("failed"), ended("up for retry")

        for task in dag.tasks:
            task.on_execute_callback = [*task.on_execute_callback, running]
            task.on_success_callback = [*task.on_success_callback, succeeded]
            task.on_failure_callback = [*task.on_failure_callback, failed]
            task.on_retry_callback = [*task.on_retry_callback, retried]
        started = time.monotonic()
        run = dag.test(run_conf=conf)
        states = {ti.task_id: str(ti.state) if ti.state else "-" for ti in run.get_task_instances()}
        self.say(f"   DAG run {run.state} in {time.monotonic() - started:.0f}s")
        return run, states

    @staticmethod
    def xcom(run: Any, task_id: str, key: str = "return_value") -> Any:
        for ti in run.get_task_instances():
            if ti.task_id == task_id:
                return ti.xcom_pull(task_ids=task_id, key=key)
        return None

    # ------------------------------------------------------------------ stage 1

    def quickstart(self) -> None:
        base = self.workdir / "quickstart"
        self.console.step("1/3 incremental ETL: a driver killed mid-run, a retry that resumes")
        expected = _write_quickstart_input(base / "input")
        self.say(f"   DAG example_sparkpoint_quickstart (task retries=1): {BATCHES} "
                 f"input files x {USERS} users, "
                 f"one micro-batch each, per-user totals merged into Delta")
        self.say("   injected failure: the first try's driver gets SIGKILL once batch "
                 f"{KILL_AFTER} is confirmed by "
                 "Spark, before Sparkpoint checkpointed it")
        catalog = job_catalog(str(base / "checkpoints"), "quickstart")
        self.watcher.follow(catalog, ["first try", "retry"])
        fired = self.workdir / "fault-fired"
        os.environ["SPARKPOINT_TEST_FAULT"] = f"confirmed:{KILL_AFTER}"
        os.environ["SPARKPOINT_TEST_FAULT_ONCE"] = str(fired)
        self.console.restart_clock()
        try:
            run, _ = self.run_dag("example_sparkpoint_quickstart", {"base_dir": str(base)})
        finally:  # the blue-green jobs run clean
            os.environ.pop("SPARKPOINT_TEST_FAULT", None)
            os.environ.pop("SPARKPOINT_TEST_FAULT_ONCE", None)
        self.watcher.poll(catalog)
        self.watcher.pause()
        (ti,) = run.get_task_instances()
        self.check("incremental ETL: the DAG run succeeded on the task's retry",
                   run.state == "success" and ti.try_number == 2, f"{run.state}, try {ti.try_number}")
        self.check("incremental ETL: the first try's driver was killed", fired.exists(),
                   f"SIGKILL once batch {KILL_AFTER} was confirmed" if fired.exists()
                   else "the fault never fired")
        last = read_generation(catalog, catalog.current_generation()).result
        first_batch = last.first_batch if last else None
        self.check("incremental ETL: the retry resumed instead of starting over",
                   isinstance(first_batch, int) and first_batch > 0,
                   f"it restored {short_name(last.restored_from if last else None)} and started at "
                   f"batch {first_batch}, not 0")

        self.say("")
        self.record_of(catalog)
        self.delta_history(base / "output", catalog.job)
        got = {r["user"]: (r["total"], r["events"]) for r in delta_rows(base / "output")}
        self.say("   table now:")
        self.lines(format_table(["user", "total", "events", "expected"],
                                [(u, *got.get(u, (None, None)), f"{t}/{e}")
                                 for u, (t, e) in sorted(expected.items())]))
        self.table_checks("incremental ETL", base / "output", "quickstart", catalog, BATCHES, got == expected)

    # ------------------------------------------------------------------ stage 2

    def start_blue(self) -> None:
        self.write_input(BLUE_BACKLOG, 1)
        self.blue.start()

    def wait_for_blue(self, batch: int, after_generation: int = 0) -> int:
        """Wait until blue checkpointed `batch` and its commit is in the table; return its generation.

        :raises RuntimeError: blue's process exited. :raises TimeoutError: it took too long.
        """
        self.watcher.follow(self.blue.catalog, ["blue"])
        generation = self.blue.wait_checkpointed(batch, after_generation=after_generation, timeout=600)
        self.watcher.set_role(BLUE_JOB, generation, "blue")
        self.blue.wait_for(f"blue's commit of batch {batch}",
                           lambda: any(c["batch"] == batch for c in delta_commits(self.blue.output)),
                           timeout=120)
        self.watcher.pause()
        return generation

    def table(self) -> dict[str, tuple[int, int, int]]:
        rows = delta_rows(self.blue.output)
        return {r["user"]: (r["total"], r["events"], r["code_version"]) for r in rows}

    def show_table(self) -> None:
        got = self.table()
        self.lines(format_table(["user", "total", "events", "code_version"],
                                [(u, *got[u]) for u in sorted(got)]))

    def failing_green(self) -> None:
        self.console.step("2/3 blue-green deploy: green fails, its output is aborted, blue is restored")
        self.say("   blue = dags/jobs/keyed_totals.py --version 1, running as its own "
                 f"spark-submit ({BLUE_TRIGGER}: "
                 "it read its backlog at start and idles; the demo decides which input each version reads)")
        self.console.restart_clock()
        blue_gen = self.wait_for_blue(0)
        self.say(f"   blue (generation {blue_gen}) is running; batch 0 (its backlog) is "
                 "checkpointed and committed:")
        self.show_table()
        first, last = self.write_input(FAILING_GREEN_INPUT, 1)
        self.say(f"   new input: files {first}-{last} arrive (batches {batch_of(first)}-{batch_of(last)}), "
                 "left for the deploy")
        self.say(f"   DAG example_sparkpoint_blue_green with green_fail_after_batch={GREEN_FAILS_AFTER}: "
                 f"green (--version 2) stages batch {GREEN_FAILS_AFTER}, then raises in "
                 f"batch {GREEN_FAILS_AFTER + 1}")
        self.watcher.follow(self.blue.catalog, ["green", "blue, restored"])
        self.console.restart_clock()
        run, states = self.run_dag("example_sparkpoint_blue_green",
                                   self.params(green_fail_after_batch=GREEN_FAILS_AFTER))
        self.watcher.poll(self.blue.catalog)
        self.watcher.pause()
        blue_exit = self.blue.wait_exit()
        catalog = self.blue.catalog
        savepoint = self.xcom(run, "stop_blue")
        green_gen = self.xcom(run, "start_green", key="generation")  # pushed as soon as green claimed it
        restored = self.xcom(run, "restore_blue") or {}
        aborted = (self.xcom(run, "abort_green") or {}).get("aborted", [])
        if green_gen:
            self.watcher.set_role(BLUE_JOB, int(green_gen), "green")
        if restored.get("generation"):
            self.watcher.set_role(BLUE_JOB, int(restored["generation"]), "blue, restored")
        green_from = read_generation(catalog, int(green_gen)).restore if green_gen else None
        green_chks = [m.id for m in self.watcher.checkpoints_of(BLUE_JOB) if m.generation == green_gen]
        self.say("")
        did = {
            "stop_blue": f"blue stopped between micro-batches (exit code {blue_exit}), "
                         f"savepoint {short_name(savepoint)}",
            "start_green": f"green (generation {green_gen}) restored {short_name(green_from)}, checkpointed "
                           f"{_ids(green_chks)}, then raised",
            "decide": f"-> {_branch(states)}: {self.xcom(run, 'decide', key='reason')}",
            "abort_green": f"aborted green's staged transactions {aborted}",
            "restore_blue": f"blue (generation {restored.get('generation')}) restored "
                            f"{short_name(restored.get('restored_from'))}, ran batches "
                            f"{restored.get('first_batch')}.."
                            f"{restored.get('last_batch')}, committed {restored.get('committed_batches')}",
            "rolled_back": "fails the run on purpose: a rolled-back deploy alerts",
        }
        self.lines(format_table(["task", "state", "what happened"],
                                [(t, states.get(t), d) for t, d in did.items()]))
        self.say("   table after the rollback (green's code would have written code_version 2):")
        self.show_table()
        self.check("blue-green rollback: blue stopped with a savepoint, green failed, the rollback ran",
                   blue_exit == 0 and states.get("start_green") == "failed"
                   and states.get("restore_blue") == "success"
                   and states.get("rolled_back") == "failed",
                   f"blue exit code {blue_exit}; " + ", ".join(f"{t} {states.get(t)}" for t in
                                                            ("start_green", "restore_blue", "rolled_back")))
        self.check("blue-green rollback: green's staged output was aborted",
                   bool(aborted) and all(t.endswith(f"-g{green_gen}") for t in aborted), f"aborted {aborted}")
        same = bool(savepoint) and green_from == savepoint and restored.get("restored_from") == savepoint
        self.check("blue-green rollback: green and the restored blue started from the same savepoint", same,
                   f"{short_name(savepoint)}: green {short_name(green_from)}, blue "
                   f"{short_name(restored.get('restored_from'))}")
        green_commits = [c["batch"] for c in delta_commits(self.blue.output) if c["generation"] == green_gen]
        shown = self.versions_with_green_rows()
        self.check("blue-green rollback: the table never showed green's output",
                   green_gen is not None and not green_commits and not shown,
                   f"commits of generation {green_gen}: {green_commits or 'none'}; "
                   "table versions with a row of "
                   f"code_version 2: {shown or 'none'}")

    def versions_with_green_rows(self, upto: int | None = None) -> list[int]:
        """Table versions (up to `upto`) that contain a row written by green's code."""
        versions = [e["version"] for e in delta_history(self.blue.output)]
        if upto is not None:
            versions = [v for v in versions if v <= upto]
        return [v for v in versions if any(r["code_version"] == 2 for r in delta_rows(self.blue.output, v))]

    def params(self, **extra: Any) -> dict[str, Any]:
        return {"job_name": BLUE_JOB, "input": str(self.blue.input), "output": str(self.blue.output), **extra}

    # ------------------------------------------------------------------ stage 3

    def healthy_green(self) -> None:
        self.console.step("3/3 blue-green deploy: a healthy green is promoted")
        catalog = self.blue.catalog
        previous = catalog.current_generation()
        first, _ = self.write_input(BLUE_AGAIN_INPUT, 1)
        self.say("   blue goes back to production: its own spark-submit again "
                 "(restore=latest: the restored blue's "
                 f"newest checkpoint); it reads file {first} as batch {batch_of(first)}")
        self.blue.start()
        self.console.restart_clock()
        blue_gen = self.wait_for_blue(batch_of(first), after_generation=previous)
        started_from = read_generation(catalog, blue_gen).origin
        self.say(f"   blue (generation {blue_gen}) is running, started from {started_from}, "
                 f"batch {batch_of(first)} checkpointed and committed")
        first, last = self.write_input(HEALTHY_GREEN_INPUT, 2)
        self.say(f"   new input: files {first}-{last} (batches {batch_of(first)}-{batch_of(last)}); DAG "
                 "example_sparkpoint_blue_green again, green healthy this time (it must "
                 "reach 2 checkpoints of its "
                 "generation and pass the audit)")
        self.watcher.follow(catalog, ["green"])
        self.console.restart_clock()
        run, states = self.run_dag("example_sparkpoint_blue_green", self.params())
        self.watcher.poll(catalog)
        self.watcher.pause()
        blue_exit = self.blue.wait_exit()
        savepoint = self.xcom(run, "stop_blue")
        green = self.xcom(run, "start_green") or {}
        healthy = self.xcom(run, "green_healthy") or {}
        audit = self.xcom(run, "audit_green") or {}
        published = self.xcom(run, "publish_green") or {}
        green_gen = green.get("generation")
        if green_gen:
            self.watcher.set_role(BLUE_JOB, int(green_gen), "green")
        green_chks = [m.id for m in self.watcher.checkpoints_of(BLUE_JOB) if m.generation == green_gen]
        self.say("")
        did = {
            "stop_blue": f"blue stopped between micro-batches (exit code {blue_exit}), "
                         f"savepoint {short_name(savepoint)}",
            "start_green": f"green (generation {green_gen}) restored "
                           f"{short_name(green.get('restored_from'))}, staged "
                           f"batches {green.get('first_batch')}..{green.get('last_batch')} "
                           f"({_ids(green_chks)}), "
                           f"committed {green.get('committed_batches')} itself (external commit mode)",
            "green_healthy": f"{healthy.get('count')} checkpoints of generation {healthy.get('generation')}",
            "audit_green": f"{audit.get('rows')} staged rows, approved={audit.get('approved')}",
            "decide": f"-> {_branch(states)}",
            "publish_green": f"committed {published.get('committed')}",
        }
        self.lines(format_table(["task", "state", "what happened"],
                                [(t, states.get(t), d) for t, d in did.items()]))
        self.say("   table after the promotion:")
        self.show_table()
        self.check("blue-green promotion: the DAG run succeeded and published green",
                   run.state == "success" and blue_exit == 0 and states.get("publish_green") == "success",
                   f"{run.state}, blue exit {blue_exit}")
        commits = delta_commits(self.blue.output)
        mine = [c["batch"] for c in commits if c["generation"] == green_gen]
        self.check("blue-green promotion: green's batches became visible only through the commit step",
                   mine == list(range(batch_of(first), batch_of(last) + 1))
                   and green.get("committed_batches") == []
                   and len(published.get("committed", [])) == len(mine),
                   f"batches {mine} committed by generation {green_gen} via publish_green")
        promoted_at = min((e["version"] for e in delta_history(self.blue.output)
                           if e["generation"] == green_gen), default=None)
        early = self.versions_with_green_rows(None if promoted_at is None else promoted_at - 1)
        self.check("blue-green promotion: no table version before the commit showed green's rows", not early,
                   f"first version with code_version 2: {promoted_at}" if not early else f"versions {early}")

    # ------------------------------------------------------------------ the record and the verdict

    def lines(self, lines: Sequence[str]) -> None:
        self.console.lines(lines)

    def record_of(self, catalog: Any) -> None:
        """Generation switches and checkpoint history of a job."""
        role = partial(self.watcher.role, catalog.job)
        self.say(f"   generation switches of job {catalog.job} (each start claims a new one; "
                 "older ones are fenced off):")
        self.lines(generation_table(catalog, role, self.watcher.states, self.t0))
        self.say(f"   checkpoint history of job {catalog.job} (as observed; retention keeps the newest):")
        current = [r for r in snapshot_records(catalog, "checkpoint", drills=False) if r.valid]
        observed = {snapshot_key(r): r for r in [*self.watcher.checkpoints_of(catalog.job), *current]}
        self.lines(checkpoint_table(observed.values(), current, role))
        self.lines(summary_lines(load_history(catalog)))
        ids = [key[0] for key in observed]
        reused = sorted({i for i in ids if ids.count(i) > 1})
        if reused:
            self.say(f"   (ids {reused} appear twice: retiring the newest checkpoint in "
                     "a rollback frees its id, "
                     "which the next checkpoint takes again)")

    def delta_history(self, table: Path, job: str) -> None:
        self.say(f"   Delta table history of {table.name}/ (commit info written by Sparkpoint):")
        self.lines(delta_history_table(delta_history(table), partial(self.watcher.role, job)))

    def table_checks(self, label: str, table: Path, job: str, catalog: Any, batches: int,
                     exact: bool) -> None:
        self.check(f"{label}: every expected row exactly once, exact totals", exact)
        commits = [c["batch"] for c in delta_commits(table)]
        self.check(f"{label}: each batch committed exactly once", commits == list(range(batches)),
                   f"batches {commits[0] if commits else '-'}..{commits[-1] if commits else '-'}, "
                   f"{len(commits)} commits, {len(commits) - len(set(commits))} repeated")
        leftovers = orphaned_staged_files(table, job)
        pending = load_history(catalog).staged
        self.check(f"{label}: nothing staged left over", not leftovers and not pending,
                   f"{len(leftovers)} orphaned staged files, {len(pending)} pending transactions")

    def record(self) -> None:
        self.console.step("the blue-green job's record")
        catalog = self.blue.catalog
        self.record_of(catalog)
        self.say(f"   savepoints of job {catalog.job} (self-contained copies, never deleted automatically):")
        self.lines(savepoint_table(catalog, partial(self.watcher.role, catalog.job), self.t0))
        self.delta_history(self.blue.output, catalog.job)
        want = expected_totals(self.plan)
        got = self.table()
        self.say("   expected from the input files (and which code version processed them last):")
        self.lines(format_table(["user", "total", "events", "code_version", "table"],
                                [(u, *want[u], "ok" if got.get(u) == want[u] else f"WRONG {got.get(u)}")
                                 for u in sorted(want)]))
        self.table_checks("blue-green", self.blue.output, BLUE_JOB, catalog, batch_of(len(self.plan) - 1) + 1,
                          got == want)

    def verdict(self) -> int:
        self.console.step("verdict")
        ok, lines = verdict_lines(self.checks)
        self.lines(lines)
        self.say(f"   DEMO {'PASSED' if ok else 'FAILED'} in {time.time() - self.t0:.0f}s")
        return 0 if ok else 1


def _branch(states: dict[str, str]) -> str:
    """The branch the blue-green DAG's `decide` took: the one of its two targets that ran."""
    ran = [t for t in ("publish_green", "abort_green") if states.get(t) not in (None, "-", "skipped")]
    return ", ".join(ran) or "neither"


def _ids(checkpoint_ids: Sequence[int]) -> str:
    return ", ".join(f"chk-{i}" for i in checkpoint_ids) or "no checkpoint"


def _write_quickstart_input(directory: Path) -> dict[str, tuple[int, int]]:
    directory.mkdir(parents=True, exist_ok=True)
    expected: dict[str, tuple[int, int]] = {}
    for i in range(BATCHES):
        rows = [(f"user-{u}", (i + 1) * (u + 1)) for u in range(USERS)]
        write_batch_file(directory, i, [{"user": user, "amount": amount} for user, amount in rows])
        for user, amount in rows:
            total, events = expected.get(user, (0, 0))
            expected[user] = (total + amount, events + 1)
    return expected
