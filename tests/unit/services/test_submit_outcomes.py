"""What a submit's run came to, as the services return it without Airflow (issue #47): a
cleared earlier try in a resumption (`services/detached_run.py` `Resumption.cleared`), a
followed run that a cleared try's trigger cancelled (`followed_end`), a launched driver's
records and claim (`services/driver_claim.py` `record_and_await_claim`) and a cluster-mode
spark-submit that named no driver (`no_driver_named`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.services.cluster_manager import Submission
from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.detached_run import (
    DETACHED_KEY,
    DetachedRecord,
    followed_end,
    resumption,
    user_stop_by,
)
from airflow_sparkpoint.services.driver_claim import no_driver_named, record_and_await_claim
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_submit import FakeStore
from tests.support.records import live_submit_run

JOB = "orders"
RUN_ID = "manual__7"
ME = AirflowTry("etl", "submit", RUN_ID, 2, None)
PROCESS = {"host": "worker-9", "boot_id": "b", "pgid": 777, "leader_start": "5", "log": "/x/driver.log"}


def live_run(catalog: Catalog, *, token: str) -> int:
    """A live generation started by try 1 of this task, submit `token`."""
    return live_submit_run(catalog, "etl", token=token, run_id=RUN_ID)


def test_a_resumption_names_the_earlier_try_that_deferred_on_the_run(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    generation = live_run(catalog, token="tok1")
    record = DetachedRecord(generation=generation, token="tok1", since=0, process=PROCESS, deadline=None)
    found = resumption(catalog, ME, own=None, record=record, dead_after=60, deadline=lambda: None)
    assert found is not None and found.cleared is None, "no try deferred on it: no clear"
    deferred = record.deferring(generation, 1)
    found = resumption(catalog, ME, own=None, record=deferred, dead_after=60, deadline=lambda: None)
    assert found is not None and found.cleared == 1
    assert resumption(catalog, AirflowTry("etl", "submit", RUN_ID, 1, None), own=None, record=deferred,
                      dead_after=60, deadline=lambda: None).cleared is None, "its own deferral is no clear"


def test_a_run_cancelled_by_a_cleared_earlier_try_is_no_end_of_the_task(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    generation = live_run(catalog, token="tok1")
    event = {"status": "success", "generation": generation, "state": "stopped"}
    assert followed_end(catalog, event, job=JOB, generation=generation, starter=ME).status == "success"
    channel = ControlChannel(catalog)
    by = user_stop_by({"dag_id": "etl", "task_id": "submit", "run_id": RUN_ID, "map_index": -1,
                       "try_number": 1})
    request = channel.submit("cancel", generation=generation, timeout_s=5.0, requested_by=by)
    channel.acknowledge(request, generation)
    channel.complete(request, generation=generation)
    end = followed_end(catalog, event, job=JOB, generation=generation, starter=ME)
    assert end.status == "cleared"
    assert end.message == (f"job {JOB} generation {generation}, which this try re-attached to, was "
                           f"cancelled by the trigger of the cleared earlier try ({by}, request "
                           f"{request.id}): starting the job again, as a cleared task does")
    finished = {"status": "success", "generation": generation, "state": "finished"}
    assert followed_end(catalog, finished, job=JOB, generation=generation, starter=ME).status == "success"
    failed = {"status": "failed", "generation": generation, "state": "stopped", "message": "boom"}
    assert followed_end(catalog, failed, job=JOB, generation=generation, starter=ME).status == "failed"


def test_a_cluster_submit_that_named_no_driver_says_its_exit_and_masked_output() -> None:
    def mask(line: str) -> str:
        return line.replace("secret", "***")

    message = no_driver_named(JOB, "yarn", Submission(1, None, ("a secret", "b")), mask)
    assert message.startswith(f"job {JOB!r}: spark-submit in cluster mode on yarn failed (exit 1) without")
    assert message.endswith("its last output:\na ***\nb")
    assert " yarn ended without naming" in no_driver_named(JOB, "yarn", Submission(0, None, ()), str)


def test_a_launched_driver_is_recorded_then_its_claim_published_then_recorded_claimed(tmp_path: Path) -> None:
    from airflow_sparkpoint.checkpoints.launches import read_launch

    catalog = Catalog(open_storage(str(tmp_path)), JOB)
    generation = live_run(catalog, token="tok1")  # the driver claims at once
    store = FakeStore()
    process = DriverProcess(**PROCESS)
    record = DetachedRecord(generation=None, token="tok1", since=0, process=process.to_json(), deadline=None)
    published: list[Any] = []

    def publish(claim: Any) -> None:  # what was recorded when the claim is published
        recorded = store.values[DETACHED_KEY]["generation"]
        published.append((claim.generation, recorded, read_launch(catalog, "tok1")))

    outcome = record_and_await_claim(catalog, process, record, job=JOB, store=store, retention="forever",
                                     log=logging.getLogger(__name__), publish=publish)
    assert outcome.claim is not None and outcome.claim.generation == generation
    [(claimed, recorded, launch)] = published
    assert (claimed, recorded) == (generation, None), "published before the record is saved claimed"
    assert launch is not None and launch.driver["pgid"] == 777 and launch.deploy_mode == "client"
    assert store.values[DETACHED_KEY] == {**record, "generation": generation}
    assert store.retention[DETACHED_KEY] == "forever"
