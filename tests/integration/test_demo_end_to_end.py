"""`sparkpoint demo` end to end, as a person runs it: its own process (it sets up its own
Airflow home and metadata database), real ``spark-submit`` processes, and afterwards no
process of it left running. The full run takes minutes (a headline promise: in the
default run); the interrupted run checks that Ctrl-C kills blue and the task's
spark-submit."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.paths import REPO

if TYPE_CHECKING:
    import psutil

SPARKPOINT = Path(sys.executable).parent / "sparkpoint"


def start_demo(workdir: Path) -> subprocess.Popen[str]:
    """The demo in a new session, so a signal to its process group is a terminal's Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARKPOINT_TEST_FAULT"))}
    return subprocess.Popen([str(SPARKPOINT), "demo", "--workdir", str(workdir)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def leftover_processes(workdir: Path) -> list[str]:
    """Processes whose command line names the demo's workdir (blue, a task's spark-submit,
    their JVMs and Python workers), waiting up to 30 s for ones that are exiting."""
    import psutil

    deadline = time.monotonic() + 30
    while True:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(workdir) in cmdline and proc.info["pid"] != os.getpid():
                found.append(f"{proc.info['pid']}: {cmdline[:200]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def gone(proc: psutil.Process, timeout: float = 30) -> bool:
    """Whether `proc` exits (or is a zombie) within `timeout` seconds. A SIGKILLed JVM stays
    "running" while the kernel frees its memory, and its command line reads empty by then,
    so `leftover_processes` no longer sees it: this waits on the process itself."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def progress_gaps(output: str) -> list[int]:
    """Seconds between consecutive progress stamps (``[  12s]``) of the same clock."""
    stamps = [int(s) for s in re.findall(r"^   \[\s*(\d+)s\]", output, re.MULTILINE)]
    return [b - a for a, b in itertools.pairwise(stamps) if b >= a]


# slow: about 4 minutes (the README's `make demo`); each of its stages runs in the default suite on its own
# (e2e kills and retries, e2e and example-DAG blue-green)
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.timeout(1800)
def test_demo_runs_every_stage_and_its_verdict_is_exactly_once(tmp_path: Path) -> None:
    workdir = tmp_path / "demo-output"
    demo = start_demo(workdir)
    try:
        output, _ = demo.communicate(timeout=1500)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    print(output)  # shown by pytest when the test fails

    assert demo.returncode == 0, output[-4000:]
    for line in [
        "== 1/3 incremental ETL",
        "== 2/3 blue-green deploy: green fails",
        "== 3/3 blue-green deploy: a healthy green is promoted",
        "task running_totals: up for retry: spark-submit exited with -9 (SIGKILL)",
        ("task start_green: failed: spark-submit exited with 1: RuntimeError: keyed_totals "
         "v2: simulated failure"),
        "[ok] incremental ETL: the retry resumed instead of starting over",
        "[ok] blue-green rollback: green's staged output was aborted",
        "[ok] blue-green rollback: green and the restored blue started from the same savepoint",
        "[ok] blue-green rollback: the table never showed green's output",
        "[ok] blue-green promotion: green's batches became visible only through the commit step",
        "[ok] blue-green: every expected row exactly once, exact totals",
        "[ok] blue-green: each batch committed exactly once: batches 0..7, 8 commits, 0 repeated",
        "[ok] blue-green: nothing staged left over",
        "exactly-once over the whole demo: YES",
        "DEMO PASSED",
    ]:
        assert line in output, f"missing: {line}"
    assert "[FAILED]" not in output and "Traceback" not in output
    for table in ("generation switches of job demo_totals", "checkpoint history of job demo_totals",
                  "savepoints of job demo_totals", "Delta table history of output/"):
        assert table in output
    restored = r"^\s+3  blue, restored\s+\+\d+s\s+savepoint-\d+-\w+\s+finished, batches 1\.\.3"
    assert re.search(restored, output, re.MULTILINE), "the generation switches show blue restored"
    assert max(progress_gaps(output)) <= 20, "the console stayed silent too long while waiting"
    assert (workdir / "logs" / "airflow.log").stat().st_size > 0, "Airflow's output goes to the log"
    assert leftover_processes(workdir) == []


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.timeout(600)
def test_interrupted_demo_kills_blue_and_the_running_spark_submit(tmp_path: Path) -> None:
    import psutil

    workdir = tmp_path / "demo-output"
    demo = start_demo(workdir)
    assert demo.stdout is not None
    lines = []
    try:
        for line in demo.stdout:  # until the quickstart task's spark-submit runs next to blue
            lines.append(line)
            if "task running_totals: running (try 1)" in line:
                break
        blue_pid = re.search(r"spark-submit, pid (\d+)", "".join(lines))
        assert blue_pid, "".join(lines)
        blue = psutil.Process(int(blue_pid.group(1)))  # its start time tells a reused pid apart
        time.sleep(5)
        os.killpg(demo.pid, signal.SIGINT)  # a terminal's Ctrl-C: the demo's process group
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        demo.stdout.close()
    output = "".join(lines) + rest
    assert demo.returncode == 128 + signal.SIGINT, output
    assert "interrupted: killing the processes the demo started" in output
    # SIGKILL is asynchronous: a loaded machine may show blue alive for a while after the
    # demo exited, so wait (up to 30 s each) for every process of the demo to go.
    assert leftover_processes(workdir) == []
    assert gone(blue), f"blue's spark-submit (pid {blue.pid}) is still running 30 s after the interrupt"
