"""A try of a submit task prepared without Airflow (`services/submit_try.py`, issue #47:
the operator only renders the settings and dispatches): its restore choice and its
``spark.sparkpoint.*`` settings, its plan logged, its start, its Spark conf, the same try
prepared again after a run of the task ended, and a drill's try under the drill's
identity. A real local catalog."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.exceptions import ConfigError, JobAlreadyRunning
from airflow_sparkpoint.services.retry import TASK_STATE_KEY, TaskRecord
from airflow_sparkpoint.services.submit_try import DrillSettings
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_submit import JOB, FakeStore, submit_settings
from tests.support.records import checkpoint_at, live_submit_run, write_status

ME = AirflowTry("etl", "submit", "manual__7", 2, None)


def catalog_in(root: Path) -> Catalog:
    return Catalog(open_storage(str(root)), JOB)


def test_the_settings_become_the_submits_conf_and_refuse_what_the_operator_sets(tmp_path: Path) -> None:
    settings = submit_settings(tmp_path, trigger="processingTime:5 seconds", checkpoint_interval="30s",
                               num_retained=2, work_dir="/live", state_partitions=4, takeover=True,
                               spark_conf={"spark.sparkpoint.checkpoint.timeout": "600", "spark.ui": "x"},
                               extra={"restore.sinkAhead": "rewind"})
    conf = settings.conf("latest")
    assert conf == {
        "spark.sparkpoint.dir": str(tmp_path), "spark.sparkpoint.job": JOB,
        "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.trigger": "processingTime:5 seconds", "spark.sparkpoint.checkpoint.interval": "30s",
        "spark.sparkpoint.checkpoint.numRetained": "2", "spark.sparkpoint.commit.mode": "checkpoint",
        "spark.sparkpoint.workDir": "/live", "spark.sparkpoint.restore.statePartitions": "4",
        "spark.sparkpoint.takeover": "true", "spark.sparkpoint.checkpoint.timeout": "600",
        "spark.sparkpoint.restore.sinkAhead": "rewind",
    }, "only spark.sparkpoint.* keys of the Spark conf are the submit's settings"
    with pytest.raises(ConfigError, match="conf sets spark.sparkpoint.dir"):
        submit_settings(tmp_path, spark_conf={"spark.sparkpoint.dir": "/elsewhere"}).conf("latest")


def test_a_hand_chosen_snapshot_is_every_trys_restore(tmp_path: Path) -> None:
    settings = submit_settings(tmp_path, restore="none", restore_snapshot=" /sp/savepoint-3 ")
    assert [settings.choose_restore(n) for n in (1, 2, 5)] == ["/sp/savepoint-3"] * 3
    assert submit_settings(tmp_path, restore="none").choose_restore(1) == "none"
    assert submit_settings(tmp_path, restore="none").choose_restore(2) == "latest"
    with pytest.raises(ConfigError, match="restore_snapshot='latest' is invalid"):
        submit_settings(tmp_path, restore_snapshot="latest").choose_restore(1)


def test_a_first_try_is_prepared_logged_and_started_with_the_users_conf_and_its_settings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    catalog = catalog_in(tmp_path)
    store = FakeStore()
    settings = submit_settings(tmp_path, restore="none", spark_conf={"spark.executor.memory": "2g"})
    logger = logging.getLogger("the-task")
    with caplog.at_level(logging.INFO, logger="the-task"):
        prepared = settings.prepare(catalog, store, 1, logger=logger)
    assert [r.getMessage() for r in caplog.records if r.name == "the-task"] == [
        f"first try: job {JOB} starts with restore=none"]
    assert (prepared.since, prepared.own, prepared.plan.restore) == (0, None, "none")
    assert prepared.settings == settings.conf("none")
    assert prepared.spark_conf == {"spark.executor.memory": "2g", **settings.conf("none")}
    token = prepared.start(catalog, ME, store=store, retention="forever")
    assert store.values[TASK_STATE_KEY] == {"try_number": 1, "restore": "none", "tokens": [token], "since": 0}
    assert store.retention[TASK_STATE_KEY] == "forever"


def test_a_start_is_refused_while_another_tasks_run_is_live_unless_the_settings_take_over(
        tmp_path: Path) -> None:
    catalog = catalog_in(tmp_path)
    live_submit_run(catalog, "production", token="theirs", run_id="manual__7")
    store = FakeStore()
    refused = submit_settings(tmp_path).prepare(catalog, store, 1)
    with pytest.raises(JobAlreadyRunning, match="generation 1"):
        refused.start(catalog, ME, store=store)
    assert TASK_STATE_KEY not in store.values, "a refused start wrote the task's record"
    taken = submit_settings(tmp_path, takeover=True).prepare(catalog, store, 1)
    assert taken.settings["spark.sparkpoint.takeover"] == "true"
    token = taken.start(catalog, ME, store=store)
    assert store.values[TASK_STATE_KEY]["tokens"] == [token]


def test_a_try_prepared_again_counts_the_checkpoint_its_ended_run_completed(tmp_path: Path) -> None:
    """A clear whose cancel came first: the try waited the task's dying run out, and that
    run's last checkpoint is the restore of the try prepared again."""
    catalog = catalog_in(tmp_path)
    store = FakeStore()
    savepoint = str(tmp_path / "savepoints" / "savepoint-3")
    TaskRecord(1, savepoint, ("tok1",), 0).save(store)
    mine = live_submit_run(catalog, "etl", token="tok1", run_id="manual__7")
    settings = submit_settings(tmp_path, restore=savepoint)
    prepared = settings.prepare(catalog, store, 2)
    assert (prepared.plan.restore, prepared.own) == (savepoint, [mine]), "no checkpoint of the task's yet"
    checkpoint_at(catalog, 4, generation=mine)
    write_status(catalog, "cancelled", generation=mine)
    again = prepared.again(catalog, store)
    assert (again.plan.restore, again.plan.try_number) == ("latest", 2)
    assert again.settings["spark.sparkpoint.restore"] == "latest"


def test_a_drills_try_restores_the_drilled_snapshot_under_the_drills_identity(tmp_path: Path) -> None:
    submit = submit_settings(tmp_path / "scratch", restore="none", extra={"restore.sinkAhead": "rewind"})
    drill = DrillSettings.of(submit, snapshot="/prod/savepoints/sp-7", drill_job=f"{JOB}-drill",
                             work="/live/drill-1")
    assert (drill.job, drill.storage_uri, drill.extra) == (JOB, str(tmp_path / "scratch"), submit.extra)
    assert [drill.choose_restore(n) for n in (1, 2)] == ["/prod/savepoints/sp-7"] * 2
    conf = drill.conf("/prod/savepoints/sp-7")
    assert conf == {**submit.conf("/prod/savepoints/sp-7"), "spark.sparkpoint.job": f"{JOB}-drill",
                    "spark.sparkpoint.restore.allowForeignJob": "true",
                    "spark.sparkpoint.workDir": "/live/drill-1"}
    prepared = drill.prepare(catalog_in(tmp_path / "scratch"), None, 3)
    assert prepared.settings == conf and prepared.plan.restore == "/prod/savepoints/sp-7"
    with pytest.raises(ConfigError, match="the drilled snapshot is resolved in execute"):
        DrillSettings.of(submit, snapshot=None, drill_job="d", work=None).choose_restore(1)
