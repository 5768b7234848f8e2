"""A second start of a running job is refused (issue #30): a real driver runs the job, a
second driver started by no Airflow task (a manual start) without ``takeover`` exits
with `JobAlreadyRunning` before it claims a generation; the first keeps running,
processes new input and its output stays exact. (The rule itself, with retries, clears,
dead runs and ``takeover=True``: tests/unit/runtime/test_takeover.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.support.race_drivers import (
    JOB,
    args,
    delta_version,
    diff,
    expected_rows,
    job_conf,
    table_rows,
    wait_for,
    write_inputs,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_second_start_is_refused_and_the_running_job_goes_on_exactly(
    tmp_path: Path, start_driver: Any
) -> None:
    root, inputs, table = tmp_path / "checkpoints", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=2)
    catalog = Catalog.open(str(root), JOB)
    running = start_driver("A", job_conf(root, {"trigger": "processingTime:500ms"}), args(tmp_path))
    wait_for(lambda: delta_version(table) == 1, "A to commit both batches", driver=running)

    second = start_driver("B", job_conf(root, {"takeover": "false"}), args(tmp_path))
    assert second.wait() != 0, f"a second start must be refused:\n{second.tail()}"
    assert "JobAlreadyRunning" in second.output and "generation 1 (running)" in second.output, second.tail()
    assert "no Airflow task" in second.output and "takeover=True" in second.output, second.tail()
    assert catalog.current_generation() == 1, "the refused start claimed a generation"
    assert running.proc.poll() is None, f"the running job ended:\n{running.tail()}"

    write_inputs(inputs, files=1, start=2)  # the running job is still the one that acts
    wait_for(lambda: delta_version(table) == 2, "A to commit the new batch", driver=running)
    channel = ControlChannel(catalog)
    stop = channel.wait(channel.submit("stop", generation=1, timeout_s=300).id, timeout_s=300, poll_s=0.3)
    assert stop.state == "completed", stop
    assert running.wait() == 0, running.tail()
    assert (running.result is not None and running.result["status"] == "stopped"
            and running.result["generation"] == 1)
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, problems
