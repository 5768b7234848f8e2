"""The control channel: submit → pending → acknowledge → complete/fail, expiry, waiting."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest, ControlResult
from airflow_sparkpoint.exceptions import ConfigError, ControlError, ObjectExists


def test_request_and_result_json_round_trip() -> None:
    request = ControlRequest("0001700000000-abcdef01", "stop", "orders", 1.5, 2.5, 3, "me")
    assert ControlRequest.from_json(request.to_json()) == request
    assert request.to_json()["schema_version"] == 1
    result = ControlResult("0001700000000-abcdef01", "completed", 3, "s3://b/sp", 7, None, 9.0)
    assert ControlResult.from_json(result.to_json()) == result
    with pytest.raises(ControlError, match="schema_version 99"):
        ControlRequest.from_json({**request.to_json(), "schema_version": 99})
    with pytest.raises(ControlError, match="malformed"):
        ControlResult.from_json({"request_id": "x", "state": "weird"})


def test_lifecycle_savepoint(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", timeout_s=60, requested_by="test")
    assert request.job == "orders" and request.deadline == pytest.approx(request.created_at + 60)
    assert channel.result(request.id).state == "pending"
    assert [r.id for r in channel.pending()] == [request.id]
    assert [r.id for r in channel.pending(generation=4)] == [request.id]  # untargeted: any generation

    job_side = ControlChannel(Catalog(catalog.storage, "orders"))  # another process's view
    taken = job_side.pending(generation=4)[0]
    assert taken == request
    job_side.acknowledge(taken, 4)
    with pytest.raises(ObjectExists):
        job_side.acknowledge(taken, 5)
    assert channel.pending() == []
    assert channel.result(request.id).state == "acknowledged"
    assert channel.result(request.id).generation == 4

    job_side.complete(taken, generation=4, savepoint="memory://x/sp", batch_id=12)
    job_side.complete(taken, generation=4, savepoint="memory://x/sp", batch_id=12)  # repeat: no-op
    result = channel.wait(request.id, timeout_s=5, poll_s=0.01)
    assert (result.state, result.generation, result.savepoint, result.batch_id) == ("completed", 4, "memory://x/sp", 12)


def test_pending_is_oldest_first_and_filters_generation(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    first = channel.submit("savepoint", generation=2)
    second = channel.submit("stop")
    third = channel.submit("cancel", generation=3)
    assert [r.id for r in channel.pending()] == [first.id, second.id, third.id]
    assert [r.id for r in channel.pending(generation=3)] == [second.id, third.id]
    assert [r.id for r in channel.pending(generation=2)] == [first.id, second.id]
    with pytest.raises(ControlError, match="addressed to generation 2, not 3"):
        channel.acknowledge(first, 3)


def test_fail_makes_wait_raise(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop")
    channel.acknowledge(request, 1)
    channel.fail(request, generation=1, error="state store commit failed")
    assert channel.result(request.id).state == "failed"
    with pytest.raises(ControlError, match=rf"stop request {request.id} of job 'orders' failed in generation 1: "
                                           "state store commit failed"):
        channel.wait(request.id, timeout_s=5, poll_s=0.01)
    with pytest.raises(ControlError, match="already has a result"):
        channel.complete(request, generation=1, savepoint="x")


def test_fail_without_ack_claims_the_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("cancel")
    channel.fail(request, generation=None, error="cancel is not supported by this sink")
    assert channel.pending() == []
    with pytest.raises(ObjectExists):
        channel.acknowledge(request, 1)
    assert channel.result(request.id).error == "cancel is not supported by this sink"


def test_complete_needs_the_acknowledging_generation(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint")
    with pytest.raises(ControlError, match="taken by nobody"):
        channel.complete(request, generation=1)
    channel.acknowledge(request, 1)
    with pytest.raises(ControlError, match="taken by generation 1"):
        channel.complete(request, generation=2)


def test_expired_request_is_not_pending_and_wait_raises(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", timeout_s=0.05)
    time.sleep(0.1)
    assert channel.pending() == []
    assert channel.result(request.id).state == "expired"
    with pytest.raises(ControlError, match="acknowledge|expired"):
        channel.acknowledge(request, 1)
    with pytest.raises(ControlError, match=rf"savepoint request {request.id} of job 'orders' expired"):
        channel.wait(request.id, timeout_s=5, poll_s=0.01)


def test_wait_raises_promptly_when_the_job_is_dead(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop", timeout_s=600)
    started = time.monotonic()
    with pytest.raises(ControlError, match=rf"stop request {request.id} of job 'orders' was not taken: the job is not"):
        channel.wait(request.id, timeout_s=60, poll_s=0.5, is_alive=lambda: False)
    assert time.monotonic() - started < 2
    # withdrawn: a job started later never acts on it
    assert channel.pending() == []
    assert channel.result(request.id).state == "expired"


def test_wait_after_ack_and_job_death_says_so(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint")
    channel.acknowledge(request, 7)
    with pytest.raises(ControlError, match="acknowledged by generation 7 but the job stopped"):
        channel.wait(request.id, timeout_s=60, poll_s=0.01, is_alive=lambda: False)


def test_result_written_before_the_job_exits_wins_over_liveness(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop")
    channel.acknowledge(request, 1)
    channel.complete(request, generation=1, savepoint="file:///sp")
    assert channel.wait(request.id, timeout_s=1, is_alive=lambda: False).savepoint == "file:///sp"


def test_wait_timeout_withdraws_an_untaken_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", timeout_s=600)
    with pytest.raises(ControlError, match=r"timed out after 0.1 s: no job acknowledged it"):
        channel.wait(request.id, timeout_s=0.1, poll_s=0.02)
    assert channel.pending() == []


def test_wait_timeout_on_an_acknowledged_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint")
    channel.acknowledge(request, 2)
    with pytest.raises(ControlError, match="acknowledged by generation 2 but not finished"):
        channel.wait(request.id, timeout_s=0.05, poll_s=0.01)


def test_wait_sees_completion_by_another_thread(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint")

    def job() -> None:
        worker = ControlChannel(Catalog(catalog.storage, "orders"))
        while not worker.pending(1):
            time.sleep(0.01)
        taken = worker.pending(1)[0]
        worker.acknowledge(taken, 1)
        worker.complete(taken, generation=1, savepoint="memory://sp", batch_id=3)

    thread = threading.Thread(target=job)
    thread.start()
    try:
        assert channel.wait(request.id, timeout_s=10, poll_s=0.02, is_alive=lambda: True).batch_id == 3
    finally:
        thread.join()


def test_two_jobs_racing_to_acknowledge_only_one_wins(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop")
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def take(generation: int) -> None:
        worker = ControlChannel(Catalog(catalog.storage, "orders"))
        barrier.wait()
        try:
            worker.acknowledge(request, generation)
        except ObjectExists:
            return
        wins.append(generation)

    threads = [threading.Thread(target=take, args=(g,)) for g in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert channel.result(request.id).generation == wins[0]


def test_bad_input(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    with pytest.raises(ConfigError, match=r"kind 'restart' is invalid; expected one of savepoint, stop, cancel"):
        channel.submit("restart")
    with pytest.raises(ConfigError, match="timeout_s=0"):
        channel.submit("stop", timeout_s=0)
    with pytest.raises(ConfigError, match="generation=0"):
        channel.submit("stop", generation=0)
    with pytest.raises(ConfigError, match="request id '../x' is invalid"):
        channel.result("../x")
    with pytest.raises(ControlError, match="does not exist"):
        channel.result("0001700000000-abcdef01")
    with pytest.raises(ConfigError, match="older_than_s=-1"):
        channel.cleanup(-1)


def test_cleanup_removes_finished_and_expired_only(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    done = channel.submit("savepoint")
    channel.acknowledge(done, 1)
    channel.complete(done, generation=1, savepoint="x")
    expired = channel.submit("stop", timeout_s=0.01)
    live = channel.submit("savepoint")
    working = channel.submit("savepoint")
    channel.acknowledge(working, 1)
    time.sleep(0.05)
    assert channel.cleanup(older_than_s=3600) == 0
    assert channel.cleanup(older_than_s=0) == 2
    remaining = {info.key.split("/")[-1].split(".")[0] for info in catalog.store.list("control")}
    assert remaining == {live.id, working.id}
    assert expired.id not in remaining
    assert [r.id for r in channel.pending()] == [live.id]
