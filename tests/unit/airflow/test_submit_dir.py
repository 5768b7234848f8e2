"""The submission directory (`airflow_sparkpoint.services.submit_dir`): one per
spark-submit, locked by the task's process, removed when spark-submit ends, and swept by a
later submission when a killed task left it (the kernel drops the lock even at SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    """The holder processes import the operators package (and Airflow) with this home."""

#: a task process: opens a submission directory in argv[1], prints its path, then sleeps
HOLDER = """
import sys, time
from airflow_sparkpoint.services.submit_dir import open_submit_dir
made = open_submit_dir(sys.argv[1])
open(made.native_dir + "/librocksdbjni-linux64.so", "wb").write(b"x" * 1024)
print(made.path, flush=True)
time.sleep(600)
"""


def test_a_submission_directory_is_locked_while_open_and_removed_with_what_the_driver_left_on_close(
    tmp_path: Path,
) -> None:
    from airflow_sparkpoint.services.submit_dir import PREFIX, open_submit_dir, sweep

    made = open_submit_dir(str(tmp_path))
    assert Path(made.path).parent == tmp_path and Path(made.path).name.startswith(PREFIX)
    assert Path(made.native_dir).is_dir()
    (Path(made.native_dir) / "librocksdbjni-linux64.so").write_bytes(b"x")
    assert sweep(str(tmp_path), min_age_s=0) == [], "its lock is held: never swept"
    made.close()
    assert not Path(made.path).exists()
    made.close()  # twice is harmless


def test_the_next_submission_sweeps_the_directory_of_a_sigkilled_task_and_keeps_a_live_ones(
    tmp_path: Path
) -> None:
    from airflow_sparkpoint.services.submit_dir import open_submit_dir, sweep

    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    killed = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=env)
    alive = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        killed_dir, alive_dir = killed.stdout.readline().strip(), alive.stdout.readline().strip()  # type: ignore[union-attr]
        assert killed_dir and alive_dir, "the holder processes did not start"
        assert sweep(str(tmp_path), min_age_s=0) == [], "both tasks are alive"
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL
        assert sweep(str(tmp_path), min_age_s=3600) == [], "younger than the minimum age: left alone"
        (tmp_path / "sparkpoint-submit-file").write_text("not a directory")
        (tmp_path / "someone-else").mkdir()
        assert sweep(str(tmp_path), min_age_s=0, now=time.time() + 1) == [killed_dir]
        assert not Path(killed_dir).exists()
        assert (Path(alive_dir) / "native" / "librocksdbjni-linux64.so").exists(), \
            "a live task's directory stays"
        assert (tmp_path / "sparkpoint-submit-file").exists() and (tmp_path / "someone-else").is_dir()
        again = open_submit_dir(str(tmp_path))  # what execute does: sweep, then create its own
        assert Path(again.path).is_dir() and Path(alive_dir).is_dir()
        again.close()
    finally:
        for proc in (killed, alive):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()  # type: ignore[union-attr]
