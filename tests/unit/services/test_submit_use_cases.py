"""The submit operator's use cases without Airflow (issue #47: the operators are front
ends over `services/`): a try's plan and start (`services/retry.py`), a deferred run's
resumption and end (`services/detached_run.py`) and the restore drill's outcome
(`services/drill.py` `run_drill`). A real local catalog; the driver's records are written
as the runtime writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.exceptions import JobAlreadyRunning
from airflow_sparkpoint.services.detached_run import (
    DETACHED_KEY,
    DetachedRecord,
    event_problem,
    resumption,
    run_end,
)
from airflow_sparkpoint.services.drill import DrillFailed, run_drill
from airflow_sparkpoint.services.retry import TASK_STATE_KEY, TaskRecord, choose_restore, plan_try
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_submit import FakeStore
from tests.support.records import checkpoint_at, live_submit_run, write_status

JOB = "orders"
RUN_ID = "manual__7"
ME = AirflowTry("etl", "submit", RUN_ID, 2, None)


def live_run(catalog: Catalog, dag_id: str, *, token: str) -> int:
    """A live generation started by try 1 of task `submit` of `dag_id`, submit `token`."""
    return live_submit_run(catalog, dag_id, token=token, run_id=RUN_ID)


def choose(restore: str) -> Any:
    return lambda try_number, catalog, own: choose_restore(try_number, restore=restore, catalog=catalog,
                                                           own_generations=own)


def test_a_first_try_plans_its_restore_and_a_refused_start_records_nothing(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    store = FakeStore()
    plan = plan_try(catalog, store, try_number=1, job=JOB, task="submit", restore="none",
                    restore_snapshot=None, choose=choose("none"))
    assert (plan.restore, plan.previous, plan.since, plan.own) == ("none", None, 0, None)
    assert plan.lines == [f"first try: job {JOB} starts with restore=none"]
    live_run(catalog, "production", token="theirs")
    with pytest.raises(JobAlreadyRunning, match="generation 1"):
        plan.start(catalog, ME, takeover=False, settings={}, store=store)
    assert TASK_STATE_KEY not in store.values, "a refused start wrote the task's record"
    token = plan.start(catalog, ME, takeover=True, settings={}, store=store, retention="forever")
    assert store.values[TASK_STATE_KEY] == {"try_number": 1, "restore": "none", "tokens": [token], "since": 0}
    assert store.retention[TASK_STATE_KEY] == "forever"


def test_a_retry_resumes_from_its_own_checkpoint_and_keeps_every_token(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    store = FakeStore()
    TaskRecord(1, "none", ("tok1",), 0).save(store)
    mine = live_run(catalog, "etl", token="tok1")
    write_status(catalog, "failed", generation=mine, error="boom")
    checkpoint_at(catalog, 4, generation=mine)
    plan = plan_try(catalog, store, try_number=2, job=JOB, task="submit", restore="none",
                    restore_snapshot=None, choose=choose("none"))
    assert (plan.restore, plan.own, plan.since) == ("latest", [mine], mine)
    assert plan.lines[0] == f"try 2: the previous try (1) ran generation {mine}, which ended failed (boom)"
    token = plan.start(catalog, ME, takeover=False, settings={}, store=store)
    assert store.values[TASK_STATE_KEY] == {"try_number": 2, "restore": "latest", "tokens": ["tok1", token],
                                            "since": 0}, "since: the first try's, not this one's"


def test_a_resumption_follows_the_run_its_record_names_else_the_claims_token(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    asked: list[bool] = []

    def deadline() -> float:
        asked.append(True)
        return 99.0

    assert resumption(catalog, ME, own=None, record=None, dead_after=60, deadline=deadline) is None
    assert asked == [], "no live run: no deadline is computed"
    generation = live_run(catalog, "etl", token="tok1")
    process = {"host": "worker-9", "boot_id": "b", "pgid": 777, "leader_start": "5", "log": "/x/driver.log"}
    lost = DetachedRecord(generation=None, token="tok1", since=0, process=process, deadline=1234.5)
    found = resumption(catalog, ME, own=None, record=lost, dead_after=60, deadline=deadline)
    assert found is not None and found.claim is not None
    assert (found.generation, found.token, found.since, found.deadline) == (generation, "tok1", 0, 1234.5)
    assert found.process is not None and found.process.pgid == 777 and found.cluster is None
    other = DetachedRecord(generation=generation + 3, token="tok9", since=0, process=process, deadline=1.0)
    found = resumption(catalog, ME, own=None, record=other, dead_after=60, deadline=deadline)
    assert found is not None
    assert (found.token, found.since, found.deadline, found.process) == ("tok1", generation - 1, 99.0, None)
    assert (resumption(catalog, ME, own=[generation + 1], record=lost, dead_after=60,
                       deadline=deadline) is None)


def test_the_detached_record_round_trips_and_an_unreadable_one_is_none() -> None:
    store = FakeStore()
    record = DetachedRecord(generation=None, token="t", since=2, process=None, deadline=None,
                            cluster={"driver": {"kind": "yarn", "application_id": "application_1_2"},
                                     "conn_id": "spark_yarn"})
    record.claimed(3).save(store, None, retention="forever")
    assert (DetachedRecord.load(store) == {**record, "generation": 3}
            and store.retention[DETACHED_KEY] == "forever")
    store.values[DETACHED_KEY] = {"generation": 3, "process": {"pgid": "not a number"}}
    assert DetachedRecord.load(store) is None


def test_an_event_is_checked_and_read_as_the_tasks_outcome() -> None:
    assert event_problem(["success"], 1) == "malformed Sparkpoint run event ['success']: expected a dict"
    assert "status 'done', expected one of success, failed, dead, timeout" in str(
        event_problem({"status": "done", "generation": 1}, 1))
    assert "this task follows generation 2" in str(event_problem({"status": "success", "generation": 1}, 2))
    dead = run_end({"status": "dead", "generation": 2, "dead_after": 60.0, "log": "/x/d.log", "host": "w9"},
                   job=JOB, generation=2)
    assert (dead.message
            == f"the driver of job {JOB!r} generation 2 is silent for more than 60 s: declared dead")
    assert dead.notes == ["the detached driver's output is /x/d.log on host w9"]
    failed = run_end({"status": "failed", "message": "boom", "driver": "pod p"}, job=JOB, generation=2)
    assert failed.message == f"job {JOB!r} generation 2 failed: boom"
    assert failed.notes == ["the driver ran on the cluster as pod p (its log is the cluster's)"]
    assert run_end({"status": "success", "log": "/x/d.log"}, job=JOB, generation=2).notes == []


def test_a_drill_outcome_is_recorded_beside_the_snapshot_and_never_raised(tmp_path: Path) -> None:
    from airflow_sparkpoint.checkpoints.verification import read_verification
    from airflow_sparkpoint.runtime.verify import record_location

    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    snapshot = checkpoint_at(catalog, 5, generation=catalog.claim_generation().generation)
    uri = catalog.checkpoint_uri(snapshot.id)
    where = record_location(uri, None)

    def fails(handle: Any) -> Any:
        raise DrillFailed("the application failed: boom")

    failed = run_drill(catalog, "latest", drill_job="orders-drill", storage_options={}, scrub=str,
                       verified_by="me", drill=fails)
    assert failed.error == f"restore drill of {uri!r} failed: the application failed: boom"
    recorded = read_verification(*where)
    assert recorded is not None and recorded.error == failed.error and recorded.level == "drill"
    passed = run_drill(catalog, "latest", drill_job="orders-drill", storage_options={}, scrub=str,
                       verified_by="me", drill=lambda handle: ({"status": "finished"}, {"generation": 1}))
    assert passed.summary() == {"ok": True, "snapshot": uri, "batch_id": 5, "verified_at": passed.verified_at,
                                "drill_job": "orders-drill", "result": {"generation": 1}}
    recorded = read_verification(*where)
    assert recorded is not None and recorded.error is None and recorded.verified_by == "me"
    missing = run_drill(catalog, "chk-404", drill_job="orders-drill", storage_options={}, scrub=str,
                        verified_by="me", drill=fails)
    assert missing.snapshot is None and missing.error is not None
    assert missing.error.startswith("restore drill of 'chk-404' failed:")


def test_a_task_follows_its_run_until_it_ends(tmp_path: Path) -> None:
    from airflow_sparkpoint.services.follow import RunFollower

    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    generation = live_run(catalog, "etl", token="tok1")
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the run ends during the second wait
        slept.append(seconds)
        if len(slept) == 2:
            write_status(catalog, "finished", generation=generation)

    event = RunFollower(catalog, generation, 60.0).until_ended(7.0, sleep=sleep)
    assert (event["status"], event["generation"], slept) == ("success", generation, [7.0, 7.0])


def test_a_detached_driver_is_recorded_in_the_launch_record_as_it_describes_itself(tmp_path: Path) -> None:
    from airflow_sparkpoint.checkpoints.launches import read_launch
    from airflow_sparkpoint.services.detached import DriverProcess
    from airflow_sparkpoint.services.runs import describe_driver, record_launch

    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    process = DriverProcess(host="worker-9", boot_id="b", pgid=777, leader_start="5", log="/x/driver.log")
    assert record_launch(catalog, "tok1", deploy_mode="client", driver=process.launch_json()) is None
    launch = read_launch(catalog, "tok1")
    assert launch is not None and launch.driver == {"kind": "process", "host": "worker-9", "pgid": 777,
                                                    "log": "/x/driver.log"}
    assert describe_driver(launch.driver) == process.describe()
