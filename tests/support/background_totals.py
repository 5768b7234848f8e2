"""The driver-kill tests' job: the quickstart's per-user running totals into a Delta table
(``dags/jobs/quickstart_totals.py``; held at the runtime's and the sink's own pause
points, e.g. ``staged``) run by ``spark-submit`` in the background, its input rows,
oracle, output reader and log tail; shared by test_driver_sigterm, test_kill_restart,
test_live_cleanup and test_stop_after_faults."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.support.inputs import delta_totals, expected_totals
from tests.support.paths import REPO
from tests.support.submit import spark_submit_command, start_spark_submit, submit_env

__all__ = ["JOB", "JOB_SCRIPT", "SPARK_CONF", "expected", "rows", "submit", "table", "tail"]

JOB_SCRIPT = REPO / "dags" / "jobs" / "quickstart_totals.py"
JOB = "sigterm_totals"
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.log.level": "WARN"}


def rows(index: int) -> list[dict[str, Any]]:
    """The rows of input file `index` (three users)."""
    return [{"user": f"u{(index + j) % 3}", "amount": index * 10 + j} for j in range(3)]


def expected(files: int) -> dict[str, tuple[int, int]]:
    """The oracle: per user (total, events) over input files 0 .. `files` - 1."""
    return expected_totals(row for index in range(files) for row in rows(index))


table = delta_totals  # the job's output table, in the oracle's shape


def submit(tmp: Path, conf: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The job started by ``spark-submit`` in the background (its output in `log`): job
    root ``tmp/sp``, input ``tmp/input``, output table ``tmp/out``."""
    env = submit_env()
    settings = {**SPARK_CONF, "spark.sparkpoint.dir": str(tmp / "sp"), "spark.sparkpoint.job": JOB, **conf}
    cmd = spark_submit_command(JOB_SCRIPT, settings,
                               ["--input", str(tmp / "input"), "--output", str(tmp / "out")], env=env)
    return start_spark_submit(cmd, env=env, log=log)


def tail(log: Path, lines: int = 40) -> str:
    """The last `lines` lines of `log`."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
