"""One default connection id, ``sparkpoint_default`` (the hook's), for every operator,
the sensor and the trigger when neither a connection nor a storage root is named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def _tasks(**where: Any) -> list[Any]:
    from airflow_sparkpoint.operators import (
        SparkpointCommitOperator,
        SparkpointHealthCheckOperator,
        SparkpointSavepointOperator,
        SparkpointSubmitOperator,
        SparkpointVerifyOperator,
    )
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    return [
        SparkpointSubmitOperator(task_id="a", job_name="orders", application="/app.py", **where),
        SparkpointVerifyOperator(task_id="b", job_name="orders", application="/app.py",
                                 output_args={"--output": "{scratch}/out"}, **where),
        SparkpointSavepointOperator(task_id="c", job_name="orders", **where),
        SparkpointCommitOperator(task_id="d", job_name="orders", **where),
        SparkpointHealthCheckOperator(task_id="e", job_name="orders", max_heartbeat_age=60, **where),
        SparkpointCheckpointSensor(task_id="f", job_name="orders", **where),
        SparkpointCheckpointTrigger(job_name="orders", **where),
    ]


def test_every_task_and_the_trigger_default_to_sparkpoint_default(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    # Old code: ConfigError "needs checkpoint_dir or sparkpoint_conn_id" for every one of them.
    monkeypatch.setenv("AIRFLOW_CONN_SPARKPOINT_DEFAULT",
                       json.dumps({"conn_type": "sparkpoint", "host": str(tmp_path / "store")}))
    tasks = _tasks()
    assert [t.sparkpoint_conn_id for t in tasks] == [SparkpointHook.default_conn_name] * len(tasks)
    assert SparkpointHook.default_conn_name == "sparkpoint_default"
    assert tasks[0].sparkpoint_hook.storage_uri == str(tmp_path / "store")  # the default connection is read
    assert tasks[-1].serialize()[1]["sparkpoint_conn_id"] == "sparkpoint_default"


def test_a_storage_root_alone_reads_no_connection(tmp_path: Path) -> None:
    tasks = _tasks(checkpoint_dir=str(tmp_path))
    assert [t.sparkpoint_conn_id for t in tasks] == [None] * len(tasks)
    assert tasks[0].sparkpoint_hook.storage_uri == str(tmp_path)


def test_a_named_connection_wins(tmp_path: Path) -> None:
    tasks = _tasks(sparkpoint_conn_id="prod_store")
    assert [t.sparkpoint_conn_id for t in tasks] == ["prod_store"] * len(tasks)
