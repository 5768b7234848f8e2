"""A deferrable `SparkpointSubmitOperator` through real ``spark-submit`` (issue #50).

The task runs in a process group of its own, as Airflow's task supervisor forks it; it
launches the driver detached, waits for its claim and defers. Then the task's whole
process group is killed with SIGKILL (what the supervisor does to a task it ends): the
driver, in its own session, goes on committing the input written after the kill. The
trigger (real, in an asyncio loop, on the real catalog) follows the run to its end after
a stop request, and ``execute_complete`` ends the task as an attached run ends: the run
result, with the Delta table exactly the oracle's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.runtime.livedir import try_lock
from airflow_sparkpoint.services.detached import DriverProcess, group_exists, stop_group
from airflow_sparkpoint.services.submit_dir import sweep
from tests.support.task_instances import FakeTI
from tests.support.totals_pipeline import E2E_JOB, Totals
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN",
              "spark.driver.host": "127.0.0.1"}


def operator_kwargs(pipeline: Totals) -> dict[str, Any]:
    return {"task_id": "job", "application": str(E2E_JOB), "job_name": pipeline.job,
            "checkpoint_dir": str(pipeline.root),
            "application_args": [f"--input={pipeline.input}", f"--output={pipeline.output}",
                                 "--files-per-batch=1", "--version=1", "--executor-pause-dir="],
            "conf": SPARK_CONF, "trigger": "processingTime:1s", "deferrable": True,
            "sparkpoint_conf": {"control.pollInterval": "0.5s"}}


TASK = textwrap.dedent("""
    import json, sys, time
    from types import SimpleNamespace
    from airflow.sdk.exceptions import TaskDeferred
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    kwargs, out = json.loads(sys.argv[1]), sys.argv[2]
    pushed = {}
    ti = SimpleNamespace(try_number=1, dag_id="d", task_id="job", run_id="r1", map_index=-1,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    op = SparkpointSubmitOperator(**kwargs)
    try:
        op.execute({"ti": ti, "run_id": "r1"})
    except TaskDeferred as deferred:
        classpath, trigger_kwargs = deferred.trigger.serialize()
        with open(out + ".tmp", "w") as handle:
            json.dump({"classpath": classpath, "trigger": trigger_kwargs, "kwargs": deferred.kwargs,
                       "method": deferred.method_name, "xcom": pushed}, handle, default=str)
        import os
        os.rename(out + ".tmp", out)
        time.sleep(3600)  # a task process that lingers: its group is killed below
    sys.exit("the task did not defer")
""")


def test_a_detached_driver_survives_its_tasks_group_kill_and_its_run_completes_exactly(
        airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    pipeline = Totals(tmp_path, "deferred")
    pipeline.write_many(2)
    out = tmp_path / "deferred.json"
    # the task's own temporary directory: the sweeps below see only this test's submissions,
    # never those of another run sharing /tmp
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    task = subprocess.Popen([sys.executable, "-c", TASK, json.dumps(operator_kwargs(pipeline)), str(out)],
                            start_new_session=True, env={**os.environ, "TMPDIR": str(private_tmp)})

    def deferred_or_none() -> dict[str, Any] | None:
        if out.exists():
            return dict(json.loads(out.read_text()))
        assert task.poll() is None, f"the task exited ({task.returncode}) without deferring"
        return None

    try:
        deferred = wait_for("the task to defer", deferred_or_none, 300)
    finally:
        if task.poll() is None:
            os.killpg(task.pid, signal.SIGKILL)  # the supervisor's kill of the task's group
        task.wait(30)
    assert deferred["classpath"] == "airflow_sparkpoint.triggers.run.SparkpointRunTrigger"
    assert deferred["method"] == "execute_complete"
    generation = deferred["kwargs"]["generation"]
    assert (deferred["xcom"]["generation"] == generation
            and deferred["xcom"]["spark_application"]["generation"] == generation), deferred["xcom"]
    process = DriverProcess.from_json(deferred["trigger"]["process"])
    request.addfinalizer(lambda: stop_group(process, grace_s=0))  # a failed check leaves no driver running
    assert process.pgid != task.pid and group_exists(process.pgid), "the driver died with its task's group"
    status = pipeline.status()
    assert os.getpgid(int(status["pid"])) == process.pgid, "the Python driver is not in the detached group"

    # The submission directory stays locked (the launcher holds the lock handed over to it):
    # a later submission's sweep cannot remove a running driver's directory.
    submit_dir = os.path.dirname(process.log)
    assert os.path.dirname(submit_dir) == str(private_tmp), submit_dir
    assert try_lock(submit_dir) is None, "the running driver's submission directory is not locked"
    assert sweep(os.path.dirname(submit_dir), min_age_s=0) == [] and os.path.isdir(submit_dir)

    # The driver goes on after its task is gone: two more input files are committed.
    pipeline.write_many(2)
    wait_for("the detached driver to commit batch 3",
             lambda: (pipeline.status().get("last_batch") or -1) >= 3 or None, 180)
    assert pipeline.catalog.current_generation() == generation

    # The trigger follows the run to its end (a stop request: the run ends "stopped").
    trigger = SparkpointRunTrigger(**deferred["trigger"])
    ControlChannel(pipeline.catalog).submit("stop", generation=generation, timeout_s=300, requested_by="test")

    async def follow() -> dict[str, Any]:
        async for event in trigger.run():
            await trigger.cleanup()
            return dict(event.payload)
        raise AssertionError("no event")

    t0 = time.monotonic()
    event = asyncio.run(asyncio.wait_for(follow(), 240))
    assert event["status"] == "success" and event["state"] == "stopped", event
    print(f"trigger saw the stop in {time.monotonic() - t0:.1f} s")

    ti = FakeTI(dag_id="d", task_id="job", run_id="r1", map_index=-1)
    op = SparkpointSubmitOperator(**operator_kwargs(pipeline))
    result = op.execute_complete({"ti": ti, "run_id": "r1"}, event, **deferred["kwargs"])
    assert result is not None and result["status"] == "stopped" and result["generation"] == generation, result
    assert result["last_batch"] == 3, result
    pipeline.assert_exact()
    wait_for("the detached process group to end", lambda: not group_exists(process.pgid) or None, 60)
    assert sweep(os.path.dirname(submit_dir), min_age_s=0) == [submit_dir], \
        "its directory is swept once it ended"
    # a malformed or foreign event is refused
    from airflow.sdk.exceptions import AirflowException

    with pytest.raises(AirflowException, match="this task follows generation"):
        op.execute_complete({"ti": ti, "run_id": "r1"}, {**event, "generation": generation + 1},
                            **deferred["kwargs"])
