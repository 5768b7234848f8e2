"""Two real drivers of one job: background ``spark-submit`` processes, the runtime's
test-only pause points (`airflow_sparkpoint.faults.pause`), input files and the oracle.

A test starts a driver armed with a pause point, waits for ``<point>.reached`` (proof
that the window was really entered), lets the other driver run, writes the release file
and checks the Delta table row by row against the input files (plain Python).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.run_result import parse_result_line
from airflow_sparkpoint.faults import ENV, ENV_ONCE, PAUSE_DIR_ENV, PAUSE_ENV
from tests.support.inputs import write_id_events
from tests.support.paths import REPO
from tests.support.submit import quiet_java_opts
from tests.support.waits import wait_for

RACES = REPO / "tests" / "races"  # the race tests, their jobs and log settings
APPEND_JOB = RACES / "jobs" / "append_job.py"
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
JOB = "race"
# These races start a second driver while the first is live on purpose: a takeover
# (runtime.takeover refuses it otherwise). A test may pass "false" to see the refusal.
TAKEOVER_CONF = {"spark.sparkpoint.takeover": "true"}
USERS = 3
BASE_MTIME = 1_700_000_000
TIMEOUT_S = float(os.environ.get("SPARKPOINT_RACE_TIMEOUT", "420"))
JAVA_OPTS = quiet_java_opts()


def write_inputs(directory: Path, files: int, start: int = 0) -> list[dict[str, Any]]:
    """`files` JSON files of `USERS` events with unique ids and increasing mtimes."""
    return write_id_events(directory, files, start=start, users=USERS)


def expected_rows(directory: Path) -> list[dict[str, Any]]:
    """The oracle: every event of every input file, read back in plain Python."""
    rows = []
    for path in sorted(directory.glob("events-*.json")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return rows


def table_rows(table: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(table)):
        return []
    return list(DeltaTable(str(table)).to_pyarrow_table().to_pylist())


def delta_version(table: Path, job: str = JOB) -> int | None:
    """The last batch of `job` committed to the Delta table (its app transaction version)."""
    from deltalake import DeltaTable

    return DeltaTable(str(table)).transaction_version(job) if DeltaTable.is_deltatable(str(table)) else None


def diff(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """Row-by-row differences: lost, duplicated or altered events (empty when exact)."""
    want = {r["id"]: r for r in expected}
    counts = Counter(int(r["id"]) for r in got)
    problems = [f"event {i} lost" for i in sorted(want) if i not in counts]
    problems += [f"event {i} written {n} times" for i, n in sorted(counts.items()) if n > 1]
    for row in got:
        ref = want.get(int(row["id"]))
        if ref is None:
            problems.append(f"unexpected row {row}")
        elif (row["user"], int(row["amount"])) != (ref["user"], ref["amount"]):
            problems.append(f"row {row} differs from the input {ref}")
    return problems


class Driver:
    """One ``spark-submit`` of a race job (`script`) in the background, in its own process
    group, optionally held at pause points (`pause`: ``point`` or ``point:batch``, one or
    several) or armed with a fault (`fault`). `timeout` bounds every wait on it."""

    def __init__(self, name: str, base: Path, conf: Mapping[str, str], args: Sequence[str], *,
                 pause: str | Sequence[str] | None = None, fault: str | None = None,
                 script: Path = APPEND_JOB,
                 master: str = "local[1]", options: Sequence[str] = (), java_opts: str = JAVA_OPTS,
                 timeout: float = TIMEOUT_S) -> None:
        self.name = name
        self.timeout = timeout
        self.log = base / f"{name}.log"
        self.pause_dir = base / f"pause-{name}"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "SPARKPOINT_TEST_PAUSE_TIMEOUT": str(2 * timeout)}  # a held driver outlives no test
        # Jobs may import test modules (a test data source); the driver's and the Python
        # workers' path starts at the script's directory, not at the checkout.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env.pop("SPARK_HOME", None)
        for key in (ENV, ENV_ONCE, PAUSE_ENV, PAUSE_DIR_ENV):
            env.pop(key, None)
        if pause:
            env[PAUSE_ENV] = pause if isinstance(pause, str) else ",".join(pause)
            env[PAUSE_DIR_ENV] = str(self.pause_dir)
        # The once-marker is created (fsynced) right before the kill: the proof that the
        # fault fired (the driver's last printed line may not make it through the JVM).
        self.fault_marker = base / f"fault-fired-{name}"
        if fault:
            env[ENV] = fault
            env[ENV_ONCE] = str(self.fault_marker)
        cmd = [SPARK_SUBMIT, "--master", master, *options, "--driver-java-options", java_opts,
               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=1",
               "--conf", "spark.default.parallelism=1", "--conf", "spark.sql.session.timeZone=UTC",
               "--conf", f"spark.pyspark.python={sys.executable}"]
        for key, value in {**TAKEOVER_CONF, **conf}.items():
            cmd += ["--conf", f"{key}={value}"]
        base.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*cmd, str(script), *args], stdout=self._out, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(base), start_new_session=True)

    # -- pause points ---------------------------------------------------------------

    def held(self, point: str) -> dict[str, Any] | None:
        """What the driver wrote at `point` if it is (or was) held there, else None; no wait."""
        marker = self.pause_dir / f"{point}.reached"
        return dict(json.loads(marker.read_text())) if marker.exists() else None

    def reached(self, point: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait until the driver is paused at `point`; return what it wrote there. A driver
        that ends first fails the test."""
        marker = self.pause_dir / f"{point}.reached"
        wait_for(f"{self.name} to reach pause point {point}", marker.exists, timeout or self.timeout,
                 self.tail, proc=self.proc)
        return dict(json.loads(marker.read_text()))

    def wait_for(self, point: str, *, or_exit: bool = False) -> dict[str, Any] | None:
        """The details of `point` once this driver is held there. With `or_exit`, None if
        the driver ended first; without, a driver that ends first fails the test."""
        def held_or_ended() -> tuple[dict[str, Any] | None] | None:
            details = self.held(point)
            if details is None and self.proc.poll() is not None:
                return (self.held(point),)  # read again: it may have reached the point, then ended
            return None if details is None else (details,)

        (details,) = wait_for(f"{self.name} to reach pause point {point}", held_or_ended, self.timeout,
                              self.tail)
        if details is None and not or_exit:
            raise AssertionError(f"{self.name} ended (exit {self.proc.returncode}) before pause point "
                                 f"{point}:\n{self.tail()}")
        return details

    def release(self, point: str) -> None:
        self.pause_dir.mkdir(parents=True, exist_ok=True)
        (self.pause_dir / f"{point}.release").write_text("go")

    # -- the end --------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> int:
        """The driver's exit code once it ended; what it left in its process group (Python
        workers) is killed then."""
        try:
            self.proc.wait(timeout=timeout or self.timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.name} did not end within {timeout or self.timeout:.0f} s:\n"
                                 f"{self.tail()}") from None
        self.stop()
        return self.proc.returncode

    def stop(self) -> None:
        """SIGKILL the whole process group (driver JVM, Python driver, workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._out.close()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def result(self) -> dict[str, Any] | None:
        result = parse_result_line(self.output)
        return None if result is None else result.to_json()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def job_conf(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's settings; `extra` keys are relative to ``spark.sparkpoint.``."""
    conf = {"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.restore": "latest", "spark.sparkpoint.control.pollInterval": "300ms"}
    conf.update({f"spark.sparkpoint.{k}": v for k, v in (extra or {}).items()})
    return conf


def args(base: Path, max_files: int = 1) -> list[str]:
    return ["--input", str(base / "input"), "--output", str(base / "table"), "--max-files", str(max_files)]


FIRST_RUN_BATCHES = 8  # what `first_run` processes


def first_run(tmp_path: Path, start_driver: Any) -> tuple[Catalog, Any]:
    """A first run of the append job over `FIRST_RUN_BATCHES` input files to its end
    (checkpoints of batches 5, 6 and 7 retained): its catalog and its oldest retained
    checkpoint."""
    root = tmp_path / "checkpoints"
    write_inputs(tmp_path / "input", files=FIRST_RUN_BATCHES)
    first = start_driver("first", job_conf(root), args(tmp_path))
    assert first.wait() == 0, first.tail()
    catalog = Catalog.open(str(root), JOB)
    retained = catalog.checkpoints()
    assert [m.batch_id for m in retained] == [7, 6, 5]
    assert delta_version(tmp_path / "table") == FIRST_RUN_BATCHES - 1
    return catalog, retained[-1]
