"""Run and inspect Sparkpoint jobs on this machine: shared by ``sparkpoint demo`` and the
example-DAG tests, never imported by the Spark-side runtime.

- `SubmittedJob`: a job as its own long-running ``spark-submit`` process, the way a
  production streaming job runs next to Airflow (a DAG talks to it only through the
  control channel).
- `write_batch_file`: one JSON-lines input file that becomes one micro-batch.
- `delta_rows`, `delta_history`, `delta_commits`, `orphaned_staged_files` (from
  `demo.tables`, importable here too): what a Delta table shows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

# the table readers stay importable from here, where they were first defined
from airflow_sparkpoint.demo.tables import delta_commits, delta_history, delta_rows, orphaned_staged_files
from airflow_sparkpoint.services.history import JobStatus, read_job_status
from airflow_sparkpoint.services.spark_env import local_spark_environment
from airflow_sparkpoint.services.stores import Catalog, job_catalog

__all__ = ["BASE_MTIME", "SPARK_CONF", "SubmittedJob", "delta_commits", "delta_history", "delta_rows",
           "orphaned_staged_files", "spark_submit_env", "write_batch_file"]

BASE_MTIME = 1_700_000_000
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN"}

T = TypeVar("T")


def write_batch_file(directory: Path, index: int, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``part-<index>.json``: with ``maxFilesPerTrigger=1`` one file is one
    micro-batch, because Spark's file source orders files by mtime and the mtime grows
    with `index`. The file appears atomically (written aside, then renamed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{index:04d}.json"
    tmp = directory / f".part-{index:04d}.tmp"
    tmp.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
    os.utime(tmp, (BASE_MTIME + index, BASE_MTIME + index))
    tmp.rename(path)
    return path


def spark_submit_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` plus what a local ``spark-submit`` of this venv needs (`local_spark_environment`:
    the venv's Python for the driver and the workers, pyspark's own SPARK_HOME, and the
    venv's bin/ first on PATH)."""
    return local_spark_environment(base)


class SubmittedJob:
    """A Sparkpoint job run by its own ``spark-submit`` on ``local[2]``.

    Layout under `base`: ``input/``, ``output/`` (passed as ``--input``/``--output``),
    ``checkpoints/`` (the storage root) and ``<job>.log`` (the process's output,
    appended to on every start). `start` may be called again after the process exited:
    the new run restores the latest checkpoint (``spark.sparkpoint.restore`` default).
    """

    def __init__(self, base: Path, script: Path | str, job: str, trigger: str, args: Sequence[str]) -> None:
        self.base = base
        self.root = base / "checkpoints"
        self.input = base / "input"
        self.output = base / "output"
        self.job = job
        self.log = base / f"{job}.log"
        self.input.mkdir(parents=True, exist_ok=True)
        self.script = Path(script)
        self.trigger = trigger
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def catalog(self) -> Catalog:
        return job_catalog(str(self.root), self.job)

    def start(self) -> None:
        """Start ``spark-submit`` in its own session (a Ctrl-C of the caller does not
        reach it: `kill` ends it). The test-only fault hook and Airflow's task context are
        never passed on.

        :raises RuntimeError: the process is still running, or ``spark-submit`` is not
            next to the interpreter.
        """
        if self.running:
            raise RuntimeError(f"job {self.job} is already running (pid {self.proc.pid})")  # type: ignore[union-attr]
        # Neither the test-only fault hook nor the Airflow task context a `dag.test()` run left
        # in this process's environment (the job would record a task try that did not start it).
        env = spark_submit_env({k: v for k, v in os.environ.items()
                                if not k.startswith(("SPARKPOINT_TEST_FAULT", "AIRFLOW_CTX_"))})
        submit = shutil.which("spark-submit", path=env["PATH"])
        if not submit:
            raise RuntimeError(f"spark-submit not found on {env['PATH']}")
        conf = {
            **SPARK_CONF,
            "spark.sparkpoint.dir": str(self.root),
            "spark.sparkpoint.job": self.job,
            "spark.sparkpoint.trigger": self.trigger,
            "spark.sparkpoint.control.pollInterval": "0.5s",
        }
        cmd = [submit, "--master", "local[2]"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [str(self.script), "--input", str(self.input), "--output", str(self.output), *self.args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> JobStatus | None:
        """The job's status record (`read_job_status`), None before the first write."""
        return read_job_status(self.catalog)

    def wait_for(self, what: str, predicate: Callable[[], T | None], timeout: float = 300) -> T:
        """Poll `predicate` until it returns a truthy value, and return that.

        :raises RuntimeError: the process exited first (the message has its log's tail).
        :raises TimeoutError: not within `timeout` seconds.
        """
        if self.proc is None:
            raise RuntimeError(f"job {self.job} was never started")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                raise RuntimeError(f"job {self.job} exited with {self.proc.returncode} while waiting for "
                                   f"{what}:\n{self.tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} of job "
                           f"{self.job}:\n{self.tail()}")

    def wait_checkpointed(self, batch: int, *, after_generation: int = 0, timeout: float = 300) -> int:
        """Wait until the running job (a generation newer than `after_generation`) has a
        completed checkpoint of `batch` or later; return its generation.

        :raises RuntimeError: the process exited first. :raises TimeoutError: too slow.
        """
        def check() -> int | None:
            status = self.status()
            if status is None or status.state != "running" or status.last_checkpoint_id is None:
                return None
            if status.generation <= after_generation:
                return None
            last = status.last_batch
            return status.generation if last is not None and last >= batch else None

        return self.wait_for(f"a checkpoint of batch {batch}", check, timeout)

    def wait_exit(self, timeout: float = 120) -> int:
        """Wait for the process to exit; return its exit code.

        :raises TimeoutError: it is still running after `timeout` seconds.
        """
        if self.proc is None:
            raise RuntimeError(f"job {self.job} was never started")
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"job {self.job} did not exit within {timeout:g} s:\n{self.tail()}") from None

    def kill(self, *, wait: bool = True) -> None:
        """SIGKILL the process group of a running job (spark-submit and its JVM); `wait`
        for it to exit (not from a signal handler: `Popen.wait` is not reentrant)."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # exited; not reaped yet
                pass
            if wait:
                self.proc.wait(timeout=60)

    def tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
