"""The live locations earlier runs left behind are removed once a run's query runs, not
only when a run ends cleanly: a run killed or failed before its end leaves its own (a
copy of the state each), and a job whose retries cannot resume in place would pile them
up on the driver's disk for as long as it keeps failing (issue 32: jobs that run for weeks).

One real ``spark-submit`` run (about half a minute), SIGKILLed once it has checkpointed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.demo.support import write_batch_file
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.config import work_root
from airflow_sparkpoint.storage import open_storage
from tests.support.background_totals import JOB, rows, submit, tail
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark]


def test_a_running_job_removes_the_live_locations_earlier_runs_left(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "sp")), JOB)
    root = Path(work_root(str(tmp_path / "sp"), JOB, None))
    left = root / "g0"  # a killed run's: an older generation, its lock free
    (left / "state" / "0" / "0").mkdir(parents=True)
    (left / "state" / "0" / "0" / "1.changelog").write_bytes(b"x" * 4096)
    held = root / "g00"  # an older generation's still held by its (fenced, live) process
    lock = livedir.try_lock(str(held))
    assert lock is not None
    newer = root / "g9"  # a newer generation's: never this run's to remove
    newer.mkdir(parents=True)
    for index in range(2):
        write_batch_file(tmp_path / "input", index, rows(index))
    log = tmp_path / "run.log"
    proc = submit(tmp_path, {"spark.sparkpoint.trigger": "processingTime:1 second"}, log)
    try:
        wait_for("batch 1 checkpointed",
                 lambda: (latest := catalog.latest()) is not None and latest.batch_id >= 1,
                 300, lambda: tail(log), proc=proc)
        assert proc.poll() is None, tail(log)  # still running: its end has not cleaned anything
        wait_for("the earlier run's live location removed", lambda: not left.exists(), 60, lambda: tail(log),
                 proc=proc)
        live = root / f"g{catalog.current_generation()}"
        assert live.is_dir() and held.is_dir() and newer.is_dir(), sorted(os.listdir(root))
    finally:
        lock.release()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, tail(log))
