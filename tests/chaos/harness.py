"""The chaos harness: real ``spark-submit`` drivers SIGKILLed by the runtime's test-only
fault hook (`airflow_sparkpoint.faults`), restarted the way an Airflow retry restarts
them (same conf, ``restore=latest``), then checked against the exact expected output.

A *trial* (`Trial`) is a scenario (`tests.chaos.scenarios`) on a fresh job with
`BATCHES` input files (one micro-batch each, 3 rows), one sink case
(`tests.chaos.cases`) and one commit mode, and one or more faults, each armed in one
process (a driver, the commit step, the rollback step) with
``SPARKPOINT_TEST_FAULT=<point>:<batch>``. In ``external`` commit mode the commit step
runs after every driver (as the DAG's commit task would).

**A trial counts only if every fault it planned fired**, proven by evidence a clean run
cannot produce (`Firing`): the once-marker file the hook creates (holding
``<point>:<batch>``), the armed process's exit by SIGKILL, and the hook's line
``SPARKPOINT_TEST_FAULT: killing driver at <point>:<batch>`` in that process's output.
A trial whose fault did not fire is FAILED, whatever the output looks like.

Then the checks: the output equals the expected rows exactly (Delta merge: totals and
event counts per user; the other sinks: every input id exactly once with its content),
computed from the input files in plain Python; no orphan staged data; no leftover
transaction record; a valid checkpoint. After a kill at ``promoting``, the batch must
really be half promoted (`SinkCase.partial_promotion`) before the retry repairs it.

Drivers run with ``local[1]``, one shuffle partition, no UI, quiet log4j and a C1-only
JIT (a short-lived driver spends most of its time compiling otherwise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints.run_result import parse_result_line
from tests.chaos.cases import JOBS
from tests.support.inputs import write_json_batches
from tests.support.sink_cases import SinkCase

HERE = Path(__file__).resolve().parent
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")
BATCHES = 4
USERS = 3
RUN_TIMEOUT_S = float(os.environ.get("SPARKPOINT_CHAOS_RUN_TIMEOUT", "420"))
DEFAULT_SEED = 20240611
JAVA_OPTS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m "
    f"-Dlog4j2.configurationFile=file:{JOBS / 'log4j2.properties'}"
)
KILL_LINE = "SPARKPOINT_TEST_FAULT: killing driver at {spec}"


def chaos_seed() -> int:
    return int(os.environ.get("SPARKPOINT_CHAOS_SEED", DEFAULT_SEED))


# ---------------------------------------------------------------------------- input


def write_inputs(directory: Path, files: int = BATCHES, start: int = 0) -> list[dict[str, Any]]:
    """`files` JSON files of `USERS` events, with ids unique over all files and
    increasing mtimes (one file = one micro-batch with ``maxFilesPerTrigger=1``)."""
    batches = [[{"id": i * 1000 + u, "user": f"u{u}", "amount": i * 10 + u + 1} for u in range(USERS)]
               for i in range(start, start + files)]
    write_json_batches(directory, batches, start=start, name="events-{:05d}.json")
    return [row for batch in batches for row in batch]


# ---------------------------------------------------------------------------- processes


@dataclass
class Run:
    """One process (a driver, or a step of the sparkpoint CLI): how it ended and what it printed."""

    returncode: int
    log: Path
    seconds: float
    result: dict[str, Any] | None = None
    timed_out: bool = False

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def submit_command(script: Path, conf: Mapping[str, str], args: Sequence[str],
                   master: str = "local[1]") -> list[str]:
    cmd = [SPARK_SUBMIT, "--master", master, "--driver-java-options", JAVA_OPTS,
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.shuffle.partitions=1",
           "--conf", "spark.default.parallelism=1",
           "--conf", "spark.sql.session.timeZone=UTC",
           "--conf", f"spark.pyspark.python={sys.executable}"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(script), *args]


def run_process(cmd: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
                timeout_s: float = RUN_TIMEOUT_S, on_poll: Callable[[], None] | None = None) -> Run:
    """Run `cmd` to its end (or SIGKILL), its output in `log`. The whole process group is
    killed afterwards, so nothing of a killed run lingers."""
    full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                **(env or {})}
    full_env.pop("SPARK_HOME", None)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    # O_APPEND: the fault hook appends its kill line to the driver JVM's stdout itself
    # (`airflow_sparkpoint.faults._announce`); no writer may overwrite another's bytes.
    log.write_bytes(b"")
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, cwd=str(log.parent))
        try:
            while True:
                try:
                    proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if on_poll is not None:
                    on_poll()
                if time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    run = Run(proc.returncode, log, time.monotonic() - started, timed_out=timed_out)
    result = parse_result_line(run.output)
    if result is not None:
        run.result = result.to_json()
    return run


def spark_submit(script: Path, *, conf: Mapping[str, str], args: Sequence[str], log: Path,
                 env: Mapping[str, str] | None = None, timeout_s: float = RUN_TIMEOUT_S,
                 on_poll: Callable[[], None] | None = None) -> Run:
    """Run a driver to its end (or SIGKILL); see `run_process`."""
    return run_process(submit_command(script, conf, args), log=log, env=env, timeout_s=timeout_s,
                       on_poll=on_poll)


# ---------------------------------------------------------------------------- faults and their evidence


@dataclass(frozen=True)
class Fault:
    """A SIGKILL at `point` of `batch`, armed in one process: ``job`` (a driver),
    ``commit`` (the commit step, ``sparkpoint commit``) or ``rollback`` (``sparkpoint
    commit --abort-generation``). A `batch` of None is chosen by the scenario when it runs
    (e.g. the batch of the checkpoint a rewind restores)."""

    point: str
    batch: int | None
    where: str = "job"

    @property
    def spec(self) -> str:
        return f"{self.point}:{self.batch}"

    def __str__(self) -> str:
        spec = self.spec if self.batch is not None else f"{self.point}:?"
        return spec + ("" if self.where == "job" else f" in the {self.where} step")


@dataclass(frozen=True)
class Firing:
    """The evidence that `fault` fired in the process that wrote `log`."""

    fault: Fault
    log: str
    marker: bool  # the once-marker exists and names this point and batch
    sigkill: bool  # the process died by SIGKILL (not a harness timeout)
    line: bool  # the hook's line is in the process's output

    @property
    def fired(self) -> bool:
        return self.marker and self.sigkill and self.line

    def describe(self) -> str:
        missing = [what for what, seen in (("once-marker", self.marker), ("SIGKILL exit", self.sigkill),
                                           ("kill line", self.line)) if not seen]
        return f"fault {self.fault} fired in {self.log}" if not missing else \
            f"fault {self.fault} did NOT fire in {self.log} (no {', no '.join(missing)})"


def evidence(fault: Fault, run: Run, marker: Path) -> Firing:
    """What `run` (armed with `fault` and the once-marker `marker`) proves."""
    marked = marker.exists() and marker.read_text().strip() == fault.spec
    killed = run.returncode == -signal.SIGKILL and not run.timed_out
    line = KILL_LINE.format(spec=fault.spec) in run.output
    return Firing(fault, run.log.name, marked, killed, line)


# ---------------------------------------------------------------------------- trials


MODES = ("checkpoint", "external")
#: who stages a DeltaSink batch (spark.sparkpoint.delta.driverStagingMaxBytes 32m or 0)
STAGING_SIDES = ("driver", "executors")


@dataclass(frozen=True)
class Trial:
    index: int
    case: str  # a case key: "delta-merge", "s3@seaweedfs", ...
    mode: str
    scenario: str  # see tests.chaos.scenarios.SCENARIOS
    faults: tuple[Fault, ...]
    #: who writes a DeltaSink batch: "driver" (the default for small batches) or "executors"
    staging: str = "driver"

    @property
    def sink(self) -> str:
        return self.case

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(f.point for f in self.faults)

    @property
    def label(self) -> str:
        side = f" staged by {self.staging}" if self.case.startswith("delta") else ""
        faults = " then ".join(str(f) for f in self.faults)
        return f"#{self.index} {self.case}/{self.mode}{side} {self.scenario}: {faults}"


@dataclass
class Verdict:
    duplicates: int = 0
    lost: int = 0
    wrong: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.duplicates and not self.lost and not self.wrong


@dataclass
class TrialResult:
    trial: Trial
    firings: list[Firing] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    logs: list[Path] = field(default_factory=list)

    def fired_point(self, point: str) -> bool:
        return any(f.fired and f.fault.point == point for f in self.firings)

    @property
    def fired(self) -> bool:
        """Every planned fault fired, with the full evidence."""
        return len(self.firings) == len(self.trial.faults) and all(f.fired for f in self.firings)

    @property
    def ok(self) -> bool:
        return self.fired and not self.problems and self.verdict.exact

    def failures(self) -> list[str]:
        unfired = [f.describe() for f in self.firings if not f.fired]
        unfired += [f"fault {f} was never armed" for f in self.trial.faults[len(self.firings):]]
        return [*unfired, *self.verdict.wrong[:3], *self.problems]


def compare(case: SinkCase, expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> Verdict:
    """Duplicated and lost input rows, and any other difference, between sink and input."""
    verdict = Verdict()
    if case.merge:
        want: dict[str, tuple[int, int]] = {}
        for row in expected:
            total, events = want.get(row["user"], (0, 0))
            want[row["user"]] = (total + row["amount"], events + 1)
        have = Counter(r["user"] for r in got)
        for user, count in have.items():
            if count > 1:
                verdict.wrong.append(f"user {user} has {count} rows in the merged table")
        table = {r["user"]: (int(r["total"]), int(r["events"])) for r in got}
        for user in sorted(set(want) | set(table)):
            w_total, w_events = want.get(user, (0, 0))
            g_total, g_events = table.get(user, (0, 0))
            if g_events > w_events:
                verdict.duplicates += g_events - w_events
            elif g_events < w_events:
                verdict.lost += w_events - g_events
            if (g_total, g_events) != (w_total, w_events):
                verdict.wrong.append(f"user {user}: got total={g_total} events={g_events}, "
                                     f"expected total={w_total} events={w_events}")
        return verdict
    want_rows = {r["id"]: r for r in expected}
    counts = Counter(int(r["id"]) for r in got)
    verdict.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    verdict.lost = sum(1 for i in want_rows if i not in counts)
    for row in got:
        ref = want_rows.get(int(row["id"]))
        if ref is None:
            verdict.wrong.append(f"unexpected row {row}")
        elif (row["user"], int(row["amount"])) != (ref["user"], ref["amount"]):
            verdict.wrong.append(f"row {row} differs from the input {ref}")
    if verdict.duplicates or verdict.lost:
        verdict.wrong.append(f"{verdict.duplicates} duplicated and {verdict.lost} lost row(s)")
    return verdict
