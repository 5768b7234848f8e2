"""A blue driver killed (SIGKILL, ``SPARKPOINT_TEST_FAULT``) at the fault points of its
``stop_after`` (issue 49): right after it took the request (``stop_after``) and after it
committed batch N and took its final checkpoint but before it completed the request
(``stopped_after``). Each trial proves its fault fired (the driver's own line, the exit
by SIGKILL); the restart (``restore=latest``) then ends with every batch's totals exact
against an oracle from the input, nothing left staged or recorded. Two ``spark-submit``
runs per trial (Delta merge, ``dags/jobs/quickstart_totals.py``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import orphaned_staged_files, write_batch_file
from airflow_sparkpoint.storage import open_storage
from tests.support.background_totals import JOB, JOB_SCRIPT, SPARK_CONF, expected, rows, table, tail
from tests.support.submit import spark_submit_command, start_spark_submit, submit_env
from tests.support.waits import wait_for

# two spark-submits per trial, 4-5 minutes each under load: make test-all
pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 3
#: the fault each trial arms (the crash matrix's evidence rule reads these lines)
ARMED = {"stop_after": {"SPARKPOINT_TEST_FAULT": f"stop_after:{N}"},
         "stopped_after": {"SPARKPOINT_TEST_FAULT": f"stopped_after:{N}"}}


def _fired(point: str, marker: str) -> bool:
    """The once-marker holds the fault that fired."""
    if point == "stop_after":
        return marker == f"stop_after:{N}"
    return marker == f"stopped_after:{N}"


def _submit(tmp: Path, conf: dict[str, str], log: Path, fault: dict[str, str] | None = None) -> object:
    env = submit_env(fault or {})
    if not fault:
        env.pop("SPARKPOINT_TEST_FAULT", None)
        env.pop("SPARKPOINT_TEST_FAULT_ONCE", None)
    settings = {**SPARK_CONF, "spark.sparkpoint.dir": str(tmp / "sp"), "spark.sparkpoint.job": JOB, **conf}
    cmd = spark_submit_command(JOB_SCRIPT, settings,
                               ["--input", str(tmp / "input"), "--output", str(tmp / "out")], env=env)
    return start_spark_submit(cmd, env=env, log=log)


@pytest.mark.parametrize("point", ["stop_after", "stopped_after"])
def test_blue_killed_in_its_stop_after_restarts_exactly(tmp_path: Path, point: str) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "sp")), JOB)
    for index in range(2):
        write_batch_file(tmp_path / "input", index, rows(index))
    log = tmp_path / "blue.log"
    proc = _submit(tmp_path, {"spark.sparkpoint.trigger": "processingTime:1 second",
                              "spark.sparkpoint.control.pollInterval": "300 milliseconds"}, log,
                   {**ARMED[point], "SPARKPOINT_TEST_FAULT_ONCE": str(tmp_path / "fired")})
    try:
        wait_for("batch 1 checkpointed",
                 lambda: (latest := catalog.latest()) is not None and latest.batch_id >= 1,
                 300, lambda: tail(log), proc=proc)
        generation = catalog.current_generation()
        request = ControlChannel(catalog).submit("stop_after", generation=generation, timeout_s=300,
                                                 after_batch=N)
        for index in range(2, 6):  # input past N is there
            write_batch_file(tmp_path / "input", index, rows(index))
        proc.wait(timeout=300)  # type: ignore[attr-defined]
    finally:
        if proc.poll() is None:  # type: ignore[attr-defined]
            os.killpg(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
            proc.wait(timeout=60)  # type: ignore[attr-defined]
    text = log.read_text(errors="replace")
    assert f"SPARKPOINT_TEST_FAULT: killing driver at {point}:{N}" in text, tail(log)  # the fault fired
    assert _fired(point, (tmp_path / "fired").read_text().strip())
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, tail(log))  # type: ignore[attr-defined]
    result = ControlChannel(catalog).result(request.id)
    assert result.state == "acknowledged", result  # taken, never completed: the orchestrator calls it off
    assert all(batch <= N for batch, _g in catalog.transaction_keys()), "a batch past N was recorded"
    if point == "stopped_after":
        latest = catalog.latest()
        assert latest is not None and latest.batch_id == N
        assert table(tmp_path / "out") == expected(N + 1), "batches 0..N are committed before the stop result"

    retry_log = tmp_path / "retry.log"
    retry = _submit(tmp_path, {"spark.sparkpoint.trigger": "availableNow"}, retry_log)
    assert retry.wait(timeout=600) == 0, tail(retry_log)  # type: ignore[attr-defined]
    assert table(tmp_path / "out") == expected(6), "every batch exactly once after the restart"
    assert catalog.transactions() == []
    assert orphaned_staged_files(tmp_path / "out", JOB) == []
