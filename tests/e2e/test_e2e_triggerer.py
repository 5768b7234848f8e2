"""The deferrable `SparkpointCheckpointSensor` under a real triggerer: the sensor defers,
its trigger runs in the ``airflow triggerer`` process, the triggerer crashes (SIGKILL)
and is started again while the sensor waits, and the new triggerer picks the trigger up
and completes it when the streaming job (a real task of the same Airflow) reaches the
condition."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.e2e.procs import read, wait_gone
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import Totals, running_with_checkpoint
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

TRIGGER = "airflow_sparkpoint.triggers.checkpoint.SparkpointCheckpointTrigger"


def trigger_logs(stack: AirflowStack, run_id: str) -> dict[int, str]:
    """The sensor's trigger log of each triggerer that ran it, by triggerer job id
    (Airflow writes ``attempt=1.log.trigger.<triggerer job id>.log`` next to the task log)."""
    folder = stack.home / "logs" / "dag_id=e2e_sensor" / f"run_id={run_id}" / "task_id=wait"
    logs = {}
    for path in folder.glob("attempt=1.log.trigger.*.log"):
        logs[int(path.name.split(".")[-2])] = path.read_text(errors="replace")
    return logs


def started_by(stack: AirflowStack, run_id: str) -> list[int]:
    """The triggerer jobs that started the sensor's trigger."""
    return sorted(job for job, text in trigger_logs(stack, run_id).items() if ") starting" in text)


def test_deferrable_sensor_completes_through_the_triggerer_across_a_triggerer_crash(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "sensed")
    pipeline.write_many(1)
    stream = airflow_api.trigger("e2e_stream", pipeline.params(trigger="processingTime:1s"))
    generation = wait_for("the streaming job's first checkpoint",
                          lambda: running_with_checkpoint(pipeline, 0),
                          600, lambda: airflow_api.describe("e2e_stream", stream))

    run = airflow_api.trigger("e2e_sensor", {"job_name": pipeline.job, "checkpoint_dir": str(pipeline.root),
                                             "generation": generation})
    deferred = airflow_api.wait_task("e2e_sensor", run, "wait", {"deferred"}, timeout=300)
    assert deferred["trigger"] and deferred["trigger"]["classpath"] == TRIGGER, deferred
    [first_job] = wait_for("the triggerer to start the trigger", lambda: started_by(airflow_stack, run), 120,
                           airflow_stack.tails)

    # Crash the triggerer mid-wait. Only one checkpoint exists: the condition (three of
    # this generation) cannot have been met before the crash.
    old = read(airflow_stack.procs["triggerer"].pid)
    assert old is not None
    airflow_stack.restart_component("triggerer", signal.SIGKILL)
    assert wait_gone([old], timeout=30) == [], "the old triggerer survived SIGKILL"
    assert pipeline.status()["checkpoints_completed"] == 1
    assert airflow_api.task_instance("e2e_sensor", run, "wait")["state"] == "deferred"

    pipeline.write_many(2)  # two more micro-batches: checkpoints 2 and 3
    jobs = wait_for("the new triggerer to take the trigger over",
                    lambda: [j for j in started_by(airflow_stack, run) if j != first_job], 300,
                    airflow_stack.tails)
    assert len(jobs) == 1, f"triggerer jobs that started the trigger after the crash: {jobs}"
    airflow_api.wait_task("e2e_sensor", run, "wait", {"success"}, timeout=600)
    seen = airflow_api.xcom("e2e_sensor", run, "wait")
    assert seen["generation"] == generation and seen["count"] >= 3 and seen["kind"] == "checkpoint", seen
    assert "trigger completed" in trigger_logs(airflow_stack, run)[jobs[0]], \
        "the new triggerer did not complete it"
    tries = airflow_api.tries("e2e_sensor", run, "wait")
    assert [t["state"] for t in tries] == ["success"], tries  # resumed after deferral, not retried

    # Stop the streaming task cleanly; its output is exact.
    ControlChannel(pipeline.catalog).submit("stop", timeout_s=300, generation=generation,
                                            requested_by="e2e test")
    airflow_api.wait_task("e2e_stream", stream, "job", {"success"}, timeout=300)
    result = airflow_api.xcom("e2e_stream", stream, "job")
    assert result["status"] == "stopped" and result["last_batch"] == 2, result
    pipeline.assert_exact()
