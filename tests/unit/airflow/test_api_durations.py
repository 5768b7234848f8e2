"""Every duration parameter of the operators, the sensor and the trigger takes a
timedelta, a number of seconds and Spark's duration strings, through one parser; a bad
value fails when the task is built, naming the parameter and the value."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.config import SparkpointConfig

pytestmark = pytest.mark.airflow

FORMS = (30, 30.0, timedelta(seconds=30), "30s", "30 seconds", "0.5 minutes")


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def _submit(root: str, **kwargs: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="t", job_name="orders", checkpoint_dir=root,
                                    application="/app.py", **kwargs)


@pytest.mark.parametrize("value", FORMS)
def test_submit_checkpoint_interval_every_form(root: str, value: Any) -> None:
    # Old code: str(timedelta(seconds=30)) == "0:00:30", refused by the conf parser.
    conf = _submit(root, checkpoint_interval=value).build_sparkpoint_conf("latest")
    assert SparkpointConfig.from_conf(conf).checkpoint_interval_s == 30.0


@pytest.mark.parametrize("value", FORMS)
def test_submit_stop_timeout_every_form(root: str, value: Any) -> None:
    # Old code: a float only ("stop_timeout=... is invalid").
    assert _submit(root, stop_timeout=value).stop_timeout == 30.0


@pytest.mark.parametrize(("name", "value"), [("checkpoint_interval", "soon"), ("checkpoint_interval", -1),
                                             ("stop_timeout", "3 months"), ("stop_timeout", True)])
def test_submit_bad_duration_fails_at_build_naming_it(root: str, name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        _submit(root, **{name: value})
    assert f"{name}={value!r}" in str(info.value)


def test_submit_templated_interval_checked_once_rendered(root: str) -> None:
    op = _submit(root, checkpoint_interval="{{ params.i }}")
    op.render_template_fields({"params": {"i": "later"}})
    with pytest.raises(ConfigError, match="checkpoint_interval='later'"):
        op.build_sparkpoint_conf("latest")


@pytest.mark.parametrize("value", FORMS)
def test_savepoint_commit_health_sensor_trigger_every_form(root: str, value: Any) -> None:
    from airflow_sparkpoint.operators import (
        SparkpointCommitOperator,
        SparkpointHealthCheckOperator,
        SparkpointSavepointOperator,
    )
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    common = {"job_name": "orders", "checkpoint_dir": root}
    sp = SparkpointSavepointOperator(task_id="sp", timeout=value, poll_interval=value,
                                     max_heartbeat_age=value, max_age=value, **common)
    assert (sp.timeout, sp.poll_interval, sp.max_heartbeat_age, sp.max_age) == (30.0,) * 4
    commit = SparkpointCommitOperator(task_id="c", max_heartbeat_age=value, **common)
    assert commit.max_heartbeat_age == 30.0
    SparkpointHealthCheckOperator(task_id="h", max_checkpoint_age=value, max_heartbeat_age=value, **common)
    sensor = SparkpointCheckpointSensor(task_id="s", progress_within=value, max_heartbeat_age=value, **common)
    assert (sensor.progress_within, sensor.max_heartbeat_age) == (30.0, 30.0)
    condition = sensor.condition()
    assert (condition.progress_within, condition.max_heartbeat_age) == (30.0, 30.0)
    trigger = SparkpointCheckpointTrigger(poll_interval=value, progress_within=value, max_heartbeat_age=value,
                                          **common)
    kwargs = trigger.serialize()[1]
    assert (kwargs["poll_interval"], kwargs["progress_within"], kwargs["max_heartbeat_age"]) == (30.0,) * 3


@pytest.mark.parametrize("value", ["soon", timedelta(seconds=-1), "2 years"])
def test_sensor_and_trigger_bad_duration_name_it(root: str, value: Any) -> None:
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    with pytest.raises(ConfigError, match="progress_within="):
        SparkpointCheckpointSensor(task_id="s", job_name="orders", checkpoint_dir=root, progress_within=value)
    with pytest.raises(ConfigError, match="poll_interval="):
        SparkpointCheckpointTrigger(job_name="orders", checkpoint_dir=root, poll_interval=value)
