"""The chaos harness: real ``spark-submit`` drivers, SIGKILLed by the runtime's test-only
fault hook (`airflow_sparkpoint.faults`), restarted the way an Airflow retry
restarts them (same conf, ``restore=latest``), then checked against the exact expected
output.

One *trial* = a fresh job with `BATCHES` input files (one micro-batch each), a first run
armed with ``SPARKPOINT_TEST_FAULT=<point>:<batch>`` (and a once-marker, so the retry runs
clean with the very same environment), the commit step after each run in ``external``
commit mode, the retry, and the checks:

* the output equals the expected rows exactly (Delta merge: totals and event counts per
  user; append sinks: every input id exactly once with its content);
* no orphan staged data (Delta ``_sparkpoint_txn/<job>/`` holds only directories the
  table references; S3 no pending multipart upload under the prefix; directory
  ``_staging`` empty);
* no leftover transaction records in the catalog.

Drivers run with ``local[1]``, one shuffle partition, no UI, quiet log4j and a C1-only
JIT (a short-lived driver spends most of its time compiling otherwise).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_sparkpoint.faults import ENV, ENV_ONCE, POINTS

HERE = Path(__file__).resolve().parent
JOBS = HERE / "jobs"
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
BATCHES = 4
USERS = 3
BASE_MTIME = 1_700_000_000
JOB = "chaos"
RUN_TIMEOUT_S = float(os.environ.get("SPARKPOINT_CHAOS_RUN_TIMEOUT", "420"))
DEFAULT_SEED = 20240611
JAVA_OPTS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m "
    f"-Dlog4j2.configurationFile=file:{JOBS / 'log4j2.properties'}"
)


def chaos_seed() -> int:
    return int(os.environ.get("SPARKPOINT_CHAOS_SEED", DEFAULT_SEED))


# ---------------------------------------------------------------------------- input


def write_inputs(directory: Path, files: int = BATCHES, start: int = 0) -> list[dict[str, Any]]:
    """`files` JSON files of `USERS` events, with ids unique over all files and
    increasing mtimes (one file = one micro-batch with ``maxFilesPerTrigger=1``)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for i in range(start, start + files):
        batch = [{"id": i * 1000 + u, "user": f"u{u}", "amount": i * 10 + u + 1} for u in range(USERS)]
        path = directory / f"events-{i:05d}.json"
        tmp = directory / f".events-{i:05d}.json.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in batch))
        os.utime(tmp, (BASE_MTIME + i, BASE_MTIME + i))
        os.replace(tmp, path)
        rows.extend(batch)
    return rows


# ---------------------------------------------------------------------------- spark-submit


@dataclass
class Run:
    """One spark-submit: how it ended and what it printed."""

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


def submit_command(script: Path, conf: Mapping[str, str], args: Sequence[str], master: str = "local[1]") -> list[str]:
    cmd = [SPARK_SUBMIT, "--master", master, "--driver-java-options", JAVA_OPTS,
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.shuffle.partitions=1",
           "--conf", "spark.default.parallelism=1",
           "--conf", "spark.sql.session.timeZone=UTC",
           "--conf", f"spark.pyspark.python={sys.executable}"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(script), *args]


def spark_submit(
    script: Path,
    *,
    conf: Mapping[str, str],
    args: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
    on_poll: Callable[[], None] | None = None,
) -> Run:
    """Run a driver to its end (or SIGKILL), its output in `log`. The whole process group
    (driver JVM, Python driver, Python workers) is killed afterwards, so nothing of a
    killed run lingers."""
    full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                **(env or {})}
    full_env.pop("SPARK_HOME", None)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        proc = subprocess.Popen(submit_command(script, conf, args), stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True, cwd=str(log.parent))
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
    for line in run.output.splitlines():
        if line.startswith("SPARKPOINT_RESULT "):
            run.result = json.loads(line[len("SPARKPOINT_RESULT "):])
    return run


# ---------------------------------------------------------------------------- sinks


class SinkCase:
    """How one sink is run by its chaos job, read back and checked for leftovers."""

    name = ""
    script = ""
    merge = False
    on_s3 = False  # writes to the moto endpoint

    def __init__(self, root: Path, s3: S3Context | None = None) -> None:
        self.root = root
        self.s3 = s3

    def output(self) -> str:
        return str(self.root / "output")

    def conf(self) -> dict[str, str]:
        """The job's S3 settings, when the case writes to the moto endpoint."""
        if not self.on_s3 or self.s3 is None:
            return {}
        return {"spark.sparkpoint.s3.endpoint": self.s3.endpoint, "spark.sparkpoint.s3.region": "us-east-1"}

    def storage_options(self) -> dict[str, Any]:
        """Connection options of the commit step (same endpoint as `conf`)."""
        if not self.on_s3 or self.s3 is None:
            return {}
        return {"endpoint_url": self.s3.endpoint, "region_name": "us-east-1"}

    def rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def leftovers(self, job: str) -> list[str]:
        """Staged data that should not exist after a successful retry."""
        raise NotImplementedError


class DeltaCase(SinkCase):
    def rows(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.output()):
            return []
        return list(DeltaTable(self.output()).to_pyarrow_table().to_pylist())

    def leftovers(self, job: str) -> list[str]:
        import pyarrow as pa
        from deltalake import DeltaTable

        staging = Path(self.output()) / "_sparkpoint_txn" / job
        if not staging.exists():
            return []
        referenced: set[str] = set()
        if DeltaTable.is_deltatable(self.output()):
            table = DeltaTable(self.output())
            paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            prefix = f"_sparkpoint_txn/{job}/"
            referenced = {p[len(prefix):].split("/", 1)[0] for p in paths if p.startswith(prefix)}
        return [f"_sparkpoint_txn/{job}/{name}" for name in sorted(os.listdir(staging)) if name not in referenced]


class DeltaMergeCase(DeltaCase):
    name = "delta-merge"
    script = "delta_merge_job.py"
    merge = True


class DeltaAppendCase(DeltaCase):
    name = "delta-append"
    script = "delta_append_job.py"


class DeltaS3Case(DeltaMergeCase):
    """The merge job into a Delta table on S3: staged objects uploaded with boto3, the
    commit a delta-rs log entry created with a conditional put."""

    name = "delta-s3"
    on_s3 = True

    def __init__(self, root: Path, s3: S3Context | None = None) -> None:
        super().__init__(root, s3)
        assert s3 is not None, "the delta-s3 case needs the moto endpoint"
        self.prefix = f"{root.name}-{uuid.uuid4().hex[:6]}/table"

    def output(self) -> str:
        assert self.s3 is not None
        return f"s3://{self.s3.bucket}/{self.prefix}"


    def _table(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        assert self.s3 is not None
        options = {"AWS_ENDPOINT_URL": self.s3.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                   "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
                   "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}
        try:
            return DeltaTable(self.output(), storage_options=options)
        except TableNotFoundError:
            return None

    def rows(self) -> list[dict[str, Any]]:
        table = self._table()
        return [] if table is None else list(table.to_pyarrow_table().to_pylist())

    def leftovers(self, job: str) -> list[str]:
        import urllib.parse

        import pyarrow as pa

        assert self.s3 is not None
        staging = f"{self.prefix}/_sparkpoint_txn/{job}/"
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=staging)
        staged = {o["Key"][len(staging):].split("/", 1)[0] for p in pages for o in p.get("Contents", ())}
        table = self._table()
        referenced: set[str] = set()
        if table is not None:
            prefix = f"_sparkpoint_txn/{job}/"
            for path in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist():
                path = urllib.parse.unquote(path)
                if path.startswith(prefix):
                    referenced.add(path[len(prefix):].split("/", 1)[0])
        return [f"_sparkpoint_txn/{job}/{name}" for name in sorted(staged - referenced)]


class DirectoryCase(SinkCase):
    name = "directory"
    script = "directory_job.py"

    def rows(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        base = Path(self.output())
        if not base.exists():
            return found
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base).parts
            if not path.is_file() or any(p.startswith(("_", ".")) for p in rel):
                continue
            found.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return found

    def leftovers(self, job: str) -> list[str]:
        staging = Path(self.output()) / "_staging"
        if not staging.exists():
            return []
        return [f"_staging/{p.relative_to(staging)}" for p in sorted(staging.rglob("*"))]


@dataclass
class S3Context:
    endpoint: str
    bucket: str

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


class S3Case(SinkCase):
    name = "s3"
    script = "s3_job.py"
    on_s3 = True

    def __init__(self, root: Path, s3: S3Context | None = None) -> None:
        super().__init__(root, s3)
        assert s3 is not None, "the S3 case needs the moto endpoint"
        self.prefix = f"{root.name}-{uuid.uuid4().hex[:6]}/out/"

    def output(self) -> str:
        assert self.s3 is not None
        return f"s3://{self.s3.bucket}/{self.prefix.rstrip('/')}"


    def rows(self) -> list[dict[str, Any]]:
        assert self.s3 is not None
        client = self.s3.client()
        found: list[dict[str, Any]] = []
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=self.prefix)
        for page in pages:
            for item in page.get("Contents", ()):
                if item["Key"][len(self.prefix):].startswith("_"):
                    continue
                body = client.get_object(Bucket=self.s3.bucket, Key=item["Key"])["Body"].read().decode()
                found.extend(json.loads(line) for line in io.StringIO(body) if line.strip())
        return found

    def leftovers(self, job: str) -> list[str]:
        assert self.s3 is not None
        pages = self.s3.client().get_paginator("list_multipart_uploads").paginate(
            Bucket=self.s3.bucket, Prefix=self.prefix)
        return [f"pending upload {u['Key']}" for p in pages for u in p.get("Uploads", ())]


CASES: dict[str, type[SinkCase]] = {
    c.name: c for c in (DeltaMergeCase, DeltaAppendCase, DeltaS3Case, S3Case, DirectoryCase)
}
SINKS = tuple(CASES)
MODES = ("checkpoint", "external")
#: who stages a DeltaSink batch (spark.sparkpoint.delta.driverStagingMaxBytes 32m or 0)
STAGING_SIDES = ("driver", "executors")


# Points on the stop-with-savepoint path: those trials run a processingTime job and stop it.
STOP_POINTS = ("savepoint", "stopped")


def points_for(mode: str) -> tuple[str, ...]:
    """Fault points that exist in `mode`: the job never commits in ``external`` mode
    (there ``promoting`` fires in the commit step, ``sparkpoint commit``)."""
    return tuple(p for p in POINTS if not (mode == "external" and p == "committed"))


def batch_for(point: str, rng: Any) -> int:
    """The batch a fault fires at: a stop-with-savepoint happens after the last batch."""
    return BATCHES - 1 if point in STOP_POINTS else rng.randrange(BATCHES)


# ---------------------------------------------------------------------------- checks


@dataclass
class Verdict:
    duplicates: int = 0
    lost: int = 0
    wrong: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.duplicates and not self.lost and not self.wrong


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


# ---------------------------------------------------------------------------- trials


@dataclass(frozen=True)
class Trial:
    index: int
    sink: str
    mode: str
    point: str
    batch: int
    #: who writes a DeltaSink batch: "driver" (the default for small batches) or "executors"
    staging: str = "driver"

    @property
    def label(self) -> str:
        side = f" staged by {self.staging}" if self.sink.startswith("delta") else ""
        return f"#{self.index} {self.sink}/{self.mode}{side} {self.point}:{self.batch}"


@dataclass
class TrialResult:
    trial: Trial
    fired: bool = False
    verdict: Verdict = field(default_factory=Verdict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    logs: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.verdict.exact


def plan_trials(sink: str, count: int, rng: Any, start_index: int = 0) -> list[Trial]:
    """`count` trials of `sink`: first every (mode, fault point) pair once, in seeded
    random order (when `count` allows), then random pairs; the batch is random too."""
    pairs = [(mode, point) for mode in MODES for point in points_for(mode)]
    rng.shuffle(pairs)
    trials = []
    for i in range(count):
        if i < len(pairs):
            mode, point = pairs[i]
        else:
            mode = rng.choice(MODES)
            point = rng.choice(points_for(mode))
        batch = batch_for(point, rng)
        trials.append(Trial(start_index + i, sink, mode, point, batch, rng.choice(STAGING_SIDES)))
    return trials


def _stop_when_drained(catalog: Any, generation_before: int) -> Callable[[], None]:
    """An `on_poll` that sends one stop (stop-with-savepoint) request once a generation
    newer than `generation_before` has confirmed the last batch."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    sent: list[bool] = []

    def poll() -> None:
        if sent:
            return
        status = catalog.read_status() or {}
        if (int(status.get("generation") or 0) > generation_before and status.get("state") == "running"
                and status.get("last_batch") == BATCHES - 1):
            ControlChannel(catalog).submit("stop", generation=int(status["generation"]), timeout_s=300,
                                          requested_by="chaos")
            sent.append(True)

    return poll


def commit_step(root: Path, storage_options: Mapping[str, Any], *, env: Mapping[str, str], log: Path) -> Run:
    """``sparkpoint commit`` of the chaos job as its own process (the fault hook armed)."""
    cmd = [str(Path(sys.executable).parent / "sparkpoint"), "commit", "--dir", str(root), "--job", JOB]
    if storage_options.get("endpoint_url"):
        cmd += ["--s3-endpoint", str(storage_options["endpoint_url"])]
    if storage_options.get("region_name"):
        cmd += ["--s3-region", str(storage_options["region_name"])]
    started = time.monotonic()
    with open(log, "wb") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                  timeout=RUN_TIMEOUT_S, check=False)
            return Run(proc.returncode, log, time.monotonic() - started)
        except subprocess.TimeoutExpired:
            return Run(-1, log, time.monotonic() - started, timed_out=True)


def run_trial(trial: Trial, base: Path, s3: S3Context | None = None) -> TrialResult:
    """Run one trial in `base` (a fresh directory) and check everything."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.sinks.commit import commit_pending

    started = time.monotonic()
    outcome = TrialResult(trial)
    base.mkdir(parents=True, exist_ok=True)
    case = CASES[trial.sink](base, s3)
    expected = write_inputs(base / "input")
    root = base / "checkpoints"
    conf = {
        "spark.sparkpoint.dir": str(root),
        "spark.sparkpoint.job": JOB,
        "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.commit.mode": trial.mode,
        "spark.sparkpoint.control.pollInterval": "300ms",
        **case.conf(),
    }
    if trial.point in STOP_POINTS:
        conf["spark.sparkpoint.trigger"] = "processingTime:500ms"
    if trial.staging == "executors":
        conf["spark.sparkpoint.delta.driverStagingMaxBytes"] = "0"
    marker = base / "fault-fired"
    env = {ENV: f"{trial.point}:{trial.batch}", ENV_ONCE: str(marker)}
    args = ["--input", str(base / "input"), "--output", case.output()]
    catalog = Catalog.open(str(root), JOB)

    def attempt(name: str) -> Run:
        poll = _stop_when_drained(catalog, catalog.current_generation()) if trial.point in STOP_POINTS else None
        run = spark_submit(JOBS / case.script, conf=conf, args=args, log=base / f"{name}.log", env=env, on_poll=poll)
        outcome.logs.append(run.log)
        if run.timed_out:
            outcome.problems.append(f"{name} timed out after {run.seconds:.0f} s")
        if trial.mode == "external":  # the commit step, after every submit (as the DAG's commit task)
            if trial.point == "promoting":
                # A process of its own, so the fault can kill it halfway through a promotion.
                step = commit_step(root, case.storage_options(), env=env, log=base / f"commit-{name}.log")
                outcome.logs.append(step.log)
                if step.returncode not in (0, -signal.SIGKILL) or step.timed_out:
                    outcome.problems.append(f"commit step after {name} failed (exit {step.returncode}):\n"
                                            f"{step.tail()}")
            else:
                try:
                    commit_pending(catalog, storage_options=case.storage_options())
                except Exception as exc:  # noqa: BLE001 - a finding, reported with the trial
                    outcome.problems.append(f"commit step after {name} failed: {type(exc).__name__}: {exc}")
        return run

    first = attempt("try1")
    outcome.fired = marker.exists()
    in_commit_step = trial.mode == "external" and trial.point == "promoting"
    if outcome.fired and first.returncode == 0 and not in_commit_step:
        outcome.problems.append("the fault fired but the first try exited 0")
    if not outcome.fired and first.returncode != 0:
        outcome.problems.append(f"the first try failed (exit {first.returncode}) without the fault firing:\n"
                                f"{first.tail()}")
    retry = attempt("try2")
    if retry.returncode != 0 or not retry.result or retry.result.get("status") not in ("finished", "stopped"):
        outcome.problems.append(f"the retry failed (exit {retry.returncode}):\n{retry.tail()}")
    try:
        outcome.verdict = compare(case, expected, case.rows())
        leftovers = case.leftovers(JOB)
        if leftovers:
            outcome.problems.append(f"orphan staged data: {leftovers[:5]}")
        records = catalog.transactions()
        if records:
            outcome.problems.append(f"leftover transaction records: {[r.txn_id for r in records]}")
        if catalog.latest() is None:
            outcome.problems.append("no valid checkpoint after the retry")
    except Exception as exc:  # noqa: BLE001 - reported with the trial
        outcome.problems.append(f"checking the output failed: {type(exc).__name__}: {exc}")
    outcome.seconds = time.monotonic() - started
    return outcome


def run_trials(trials: Sequence[Trial], base: Path, s3: S3Context | None = None, workers: int = 1,
               progress: Callable[[TrialResult], None] | None = None) -> list[TrialResult]:
    """Run `trials` on `workers` threads (each trial is its own spark-submit processes)."""
    lock = threading.Lock()

    def one(trial: Trial) -> TrialResult:
        result = run_trial(trial, base / f"t{trial.index:03d}-{trial.sink}", s3)
        if progress is not None:
            with lock:
                progress(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, trials))


# ---------------------------------------------------------------------------- report

REPORTS: list[tuple[str, list[TrialResult], int]] = []


def format_report(title: str, results: Sequence[TrialResult], seed: int) -> str:
    """The summary table: trials, faults injected by kind, duplicates, rows lost, seed."""
    kinds = [p for p in POINTS if any(r.trial.point == p for r in results)]
    header = ["sink", "trials", *kinds, "not fired", "duplicates", "lost", "failed"]
    rows = []
    for sink in [*SINKS, "total"]:
        mine = [r for r in results if sink in ("total", r.trial.sink)]
        if not mine:
            continue
        fired = Counter(r.trial.point for r in mine if r.fired)
        rows.append([sink, str(len(mine)), *(str(fired.get(k, 0)) for k in kinds),
                     str(sum(1 for r in mine if not r.fired)),
                     str(sum(r.verdict.duplicates for r in mine)), str(sum(r.verdict.lost for r in mine)),
                     str(sum(1 for r in mine if not r.ok))])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [f"{title} (seed {seed}; SPARKPOINT_CHAOS_SEED={seed} reproduces it)",
             "  ".join(h.rjust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    modes = Counter(r.trial.mode for r in results)
    sides = Counter(r.trial.staging for r in results if r.trial.sink.startswith("delta"))
    lines.append(f"commit modes: {dict(sorted(modes.items()))}; Delta staged by: {dict(sorted(sides.items()))}; "
                 f"wall time per trial: median {sorted(r.seconds for r in results)[len(results) // 2]:.0f} s")
    for r in results:
        if not r.ok:
            lines.append(f"FAILED {r.trial.label}: " + "; ".join([*r.verdict.wrong[:3], *r.problems])[:2000])
    return "\n".join(lines)
