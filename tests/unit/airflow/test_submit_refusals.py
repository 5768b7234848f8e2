"""Bad input to `SparkpointSubmitOperator` is refused before anything runs (issue #48):
every ``spark.sparkpoint.*`` key validated wherever it is passed, a relative storage root,
a relative `application` resolved against the DAG file's folder (or refused with the path
it tried), a missing Spark connection and a missing ``spark-submit`` named as such. Each
refusal is a `ConfigError` that is also an `AirflowFailException`: the task fails without
using up its retries.

spark-submit is the stand-in of `tests.support.fake_submit` (`driver`): "nothing submitted" is its
empty command list; "nothing recorded" is the task state store left empty.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from tests.support.fake_submit import JOB, Driver, FakeStore, driver, operator  # noqa: F401
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def refused(op: Any, *, match: str) -> ConfigError:
    """`op.execute` raises a ConfigError matching `match` that Airflow does not retry."""
    from airflow.sdk.exceptions import AirflowFailException

    store = FakeStore()
    with pytest.raises(ConfigError, match=match) as info:
        op.execute({"ti": FakeTI(), "task_state_store": store})
    assert isinstance(info.value, AirflowFailException), type(info.value).__mro__
    assert store.values == {}, "a refused start recorded a try"
    return info.value


# ------------------------------------------------------------------ spark.sparkpoint.* in conf


def test_an_unknown_sparkpoint_key_in_conf_is_refused_before_submit_with_a_suggestion(
        tmp_path: Path, driver: Driver) -> None:  # noqa: F811
    op = operator(tmp_path / "sp", conf={"spark.sparkpoint.checkpoint.numRetaned": "2"})
    refused(op, match=r"spark\.sparkpoint\.checkpoint\.numRetaned is not a known setting; did you mean "
                      r"spark\.sparkpoint\.checkpoint\.numRetained\?")
    assert driver.commands == []


def test_a_bad_value_in_conf_is_refused_and_a_good_one_is_what_the_driver_gets(
        tmp_path: Path, driver: Driver) -> None:  # noqa: F811
    refused(operator(tmp_path / "sp", conf={"spark.sparkpoint.checkpoint.numRetained": "0"}),
            match=r"checkpoint\.numRetained='0' is too small")
    assert driver.commands == []
    # a key in conf is a setting like one in sparkpoint_conf, not silently replaced by a default
    operator(tmp_path / "sp", conf={"spark.sparkpoint.checkpoint.numRetained": "5"}).execute({"ti": FakeTI()})
    assert driver.conf()["spark.sparkpoint.checkpoint.numRetained"] == "5"
    # and sparkpoint_conf, the operator's own place for them, wins over conf
    operator(tmp_path / "sp", conf={"spark.sparkpoint.checkpoint.numRetained": "5"},
             sparkpoint_conf={"checkpoint.numRetained": "4"}).execute({"ti": FakeTI()})
    assert driver.conf()["spark.sparkpoint.checkpoint.numRetained"] == "4"


@pytest.mark.parametrize(("where", "key", "parameter"), [
    ("conf", "spark.sparkpoint.dir", "checkpoint_dir"),
    ("sparkpoint_conf", "dir", "checkpoint_dir"),
    ("conf", "spark.sparkpoint.job", "job_name"),
    ("sparkpoint_conf", "restore", "restore"),
])
def test_settings_the_operator_owns_are_refused_in_conf_and_sparkpoint_conf(
        tmp_path: Path, driver: Driver, where: str, key: str, parameter: str) -> None:  # noqa: F811
    # the operator watches the store and the job it was given, and chooses the restore per try
    refused(operator(tmp_path / "sp", **{where: {key: "/elsewhere"}}), match=rf"{key}.*{parameter}")
    assert driver.commands == []


# ------------------------------------------------------------------ relative storage roots


def test_a_relative_checkpoint_dir_is_refused_naming_it(tmp_path: Path, driver: Driver,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    refused(operator(tmp_path, checkpoint_dir="checkpoints"),
            match=r"storage root 'checkpoints' .*relative.*absolute")
    assert driver.commands == [] and not (tmp_path / "checkpoints").exists()


def test_a_connection_whose_host_is_a_relative_path_is_refused_naming_it(
        tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_SP_RELATIVE",
                       json.dumps({"conn_type": "sparkpoint", "host": "checkpoints"}))
    with pytest.raises(ConfigError, match=r"connection 'sp_relative'.*'checkpoints'.*relative"):
        SparkpointHook("sp_relative").get_catalog(JOB)
    op = SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB,
                                  sparkpoint_conn_id="sp_relative")
    refused(op, match=r"connection 'sp_relative'.*'checkpoints'.*relative")
    assert driver.commands == [] and not (tmp_path / "checkpoints").exists()


# ------------------------------------------------------------------ a relative application


def _in_dag(tmp_path: Path, **kwargs: Any) -> Any:
    """The operator in a DAG whose file is ``<tmp_path>/dags/orders_dag.py``."""
    from airflow.sdk import DAG

    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    with DAG(dag_id="orders_dag", schedule=None) as dag:
        op = SparkpointSubmitOperator(task_id="submit", job_name=JOB, checkpoint_dir=str(tmp_path / "sp"),
                                      **kwargs)
    dag.fileloc = str(tmp_path / "dags" / "orders_dag.py")
    return op


def test_a_relative_application_runs_from_the_dag_files_folder(tmp_path: Path, driver: Driver,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "dags" / "jobs" / "orders.py"
    script.parent.mkdir(parents=True)
    script.write_text("print('a job')\n")
    monkeypatch.chdir(tmp_path / "dags" / "jobs")  # a working directory where the path means something else
    _in_dag(tmp_path, application="jobs/orders.py").execute({"ti": FakeTI()})
    assert str(script) in driver.commands[-1], driver.commands[-1]
    assert "jobs/orders.py" not in [token for token in driver.commands[-1] if token != str(script)]


def test_a_relative_application_that_is_not_there_is_refused_with_the_path_it_tried(
        tmp_path: Path, driver: Driver) -> None:  # noqa: F811
    tried = tmp_path / "dags" / "dags" / "jobs" / "orders.py"
    refused(_in_dag(tmp_path, application="dags/jobs/orders.py"),
            match=rf"application 'dags/jobs/orders.py'.*{tried}")
    assert driver.commands == []


def test_a_relative_application_without_a_dag_file_is_refused(tmp_path: Path, driver: Driver) -> None:  # noqa: F811
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    op = SparkpointSubmitOperator(task_id="submit", application="jobs/orders.py", job_name=JOB,
                                  checkpoint_dir=str(tmp_path / "sp"))
    refused(op, match=r"application 'jobs/orders.py' is a relative path")
    assert driver.commands == []


# ------------------------------------------------------------------ Spark itself


def test_a_missing_spark_connection_is_named_instead_of_falling_back_to_yarn(
        tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    refused(operator(tmp_path / "sp"), match=r"Spark connection 'spark_default' does not exist")
    assert driver.commands == []


def test_a_missing_sparkpoint_connection_is_named_with_what_to_create(
        tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # The tutorial's second connection forgotten: the operator reads sparkpoint_default.
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    monkeypatch.delenv("AIRFLOW_CONN_SPARKPOINT_DEFAULT", raising=False)
    op = SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB)
    refused(op,
            match=r"Sparkpoint connection 'sparkpoint_default' does not exist: create it \(type sparkpoint")
    assert driver.commands == []


def test_a_missing_spark_submit_is_named(tmp_path: Path, driver: Driver,  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A Spark connection asking for spark3-submit, which this worker does not have.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "local[2]", "extra": {"spark-binary": "spark3-submit"}}))
    refused(operator(tmp_path / "sp"), match=r"spark3-submit .*not found on the PATH")
    assert driver.commands == []


def test_a_refused_start_fails_the_task_without_using_up_its_retries(
        tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from airflow_sparkpoint.operators import SparkpointSubmitOperator
    from tests.support.dag_runs import new_dag, run_dag

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    with new_dag("refused") as dag:
        SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB,
                                 checkpoint_dir=str(tmp_path / "sp"), retries=2,
                                 retry_delay=timedelta(seconds=0))
    run = run_dag(dag)
    (ti,) = run.get_task_instances()
    assert (str(ti.state), ti.try_number) == ("failed", 1)
    assert driver.commands == []
