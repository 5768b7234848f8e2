"""The operators and the sensor hold their job's hook and their asset events as parts
(issue 47: no class spread over files by mixins): the hook follows the operator's
rendered fields, and a deep copy of a task (Airflow makes them) and the DAG's
serialization carry both parts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.support.dag_runs import new_dag

pytestmark = pytest.mark.airflow

JOB = "orders"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def _dag(checkpoint_dir: str) -> tuple[Any, list[Any]]:
    """A DAG of the six tasks with a Sparkpoint job (the drill overrides the hook)."""
    from airflow_sparkpoint.operators import (
        SparkpointCommitOperator,
        SparkpointCutoverOperator,
        SparkpointHealthCheckOperator,
        SparkpointSavepointOperator,
        SparkpointSubmitOperator,
    )
    from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

    with new_dag("parts") as dag:
        tasks = [
            SparkpointSubmitOperator(task_id="submit", application="/app.py", job_name=JOB,
                                     checkpoint_dir=checkpoint_dir, sink={"kind": "delta", "uri": "/t/a"}),
            SparkpointCommitOperator(task_id="commit", job_name=JOB, checkpoint_dir=checkpoint_dir,
                                     sink={"kind": "delta", "uri": "/t/a"}),
            SparkpointSavepointOperator(task_id="savepoint", job_name=JOB, checkpoint_dir=checkpoint_dir),
            SparkpointCutoverOperator(task_id="cutover", job_name=JOB, cutover_id="c1",
                                      checkpoint_dir=checkpoint_dir),
            SparkpointHealthCheckOperator(task_id="health", job_name=JOB, checkpoint_dir=checkpoint_dir,
                                          max_heartbeat_age=60),
            SparkpointCheckpointSensor(task_id="sensor", job_name=JOB, checkpoint_dir=checkpoint_dir),
        ]
    return dag, tasks


def test_the_hook_opens_the_store_the_rendered_fields_name(tmp_path: Path) -> None:
    # Old code: the hook made before rendering stayed (a cached_property of the mixin).
    _, tasks = _dag(str(tmp_path / "{{ params.store }}"))
    for task in tasks:
        assert task.hook is task.sparkpoint_hook  # made once while the fields stay
        task.render_template_fields({"params": {"store": "rendered"}})
        assert task.checkpoint_dir == str(tmp_path / "rendered")
        assert task.sparkpoint_hook.storage_uri == str(tmp_path / "rendered"), task.task_id
        assert task.hook is task.sparkpoint_hook


def test_a_deep_copy_holds_its_own_parts(tmp_path: Path) -> None:
    from airflow.sdk import AssetAlias

    dag, tasks = _dag(str(tmp_path / "a"))
    for task in tasks:
        assert task.sparkpoint_hook.storage_uri == str(tmp_path / "a")
        copied = copy.deepcopy(task)
        copied.checkpoint_dir = str(tmp_path / "b")
        assert copied.sparkpoint_hook.storage_uri == str(tmp_path / "b"), task.task_id
        assert task.sparkpoint_hook.storage_uri == str(tmp_path / "a"), task.task_id
    submit, commit, savepoint = tasks[:3]
    for task in (submit, commit, savepoint):
        alias = AssetAlias(f"sparkpoint:{dag.dag_id}.{task.task_id}")
        assert task.outlets == [alias] and task.assets_alias == alias
        assert copy.deepcopy(task).outlets == [alias]
    for task in (submit, commit):
        copied = copy.deepcopy(task)
        copied.sink = {"kind": "delta", "uri": "/t/b"}  # the copy's events read the copy
        assert copied.declared_output().location_uri.endswith("/t/b"), task.task_id
        assert task.declared_output().location_uri.endswith("/t/a"), task.task_id


def test_the_dag_serializes_and_its_tasks_keep_their_fields(tmp_path: Path) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    dag, tasks = _dag(str(tmp_path / "a"))
    for task in tasks:
        task.sparkpoint_hook  # noqa: B018 - a made hook is no field of the serialized task
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for task in tasks:
        again = restored.get_task(task.task_id)
        assert (again.job_name, again.checkpoint_dir) == (JOB, str(tmp_path / "a"))
        assert not {"_job_hook", "_asset_events"} & set(vars(again))
    assert [o.name for o in restored.get_task("commit").outlets] == [f"sparkpoint:{dag.dag_id}.commit"]


def test_a_drill_opens_the_production_store_as_rendered_and_its_own_only_in_execute(tmp_path: Path) -> None:
    from airflow_sparkpoint.exceptions import ConfigError
    from airflow_sparkpoint.operators import SparkpointVerifyOperator

    with new_dag("drill_parts"):
        drill = SparkpointVerifyOperator(task_id="drill", application="/app.py", job_name=JOB,
                                         checkpoint_dir=str(tmp_path / "{{ params.store }}"),
                                         output_args={"--output": "{scratch}/out"})
    drill.production_hook  # noqa: B018 - made before rendering
    drill.render_template_fields({"params": {"store": "rendered"}})
    assert drill.production_hook.storage_uri == str(tmp_path / "rendered")
    with pytest.raises(ConfigError, match="chosen in execute"):
        drill.sparkpoint_hook  # noqa: B018


def test_the_task_airflow_runs_emits_with_its_own_rendered_fields(tmp_path: Path) -> None:
    """Airflow runs a shallow copy of the task (`prepare_for_execution`) and renders the
    templates onto it: its asset events and OpenLineage outputs look the job's sink up by
    the rendered job name, not by the parsed task's template (found by review: the parts
    held the parsed task)."""
    from unittest import mock

    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointCommitOperator, SparkpointSubmitOperator

    with new_dag("parts_copy"):
        tasks = [SparkpointSubmitOperator(task_id="submit", application="/app.py",
                                          job_name="{{ params.job }}", checkpoint_dir=str(tmp_path)),
                 SparkpointCommitOperator(task_id="commit", job_name="{{ params.job }}",
                                          checkpoint_dir=str(tmp_path))]
    for task in tasks:
        run = task.prepare_for_execution()
        run.render_template_fields({"params": {"job": JOB}})
        with mock.patch.object(SparkpointHook, "declared_sink", return_value=None) as declared_sink:
            run.declared_output()
        assert [c.args[-1] for c in declared_sink.call_args_list] == [JOB], task.task_id
