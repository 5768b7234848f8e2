"""The control channel: submit → pending → acknowledge → complete/fail, expiry, waiting."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest, ControlResult
from airflow_sparkpoint.exceptions import ConfigError, ControlError, ObjectExists

#: a savepoint of the job (a control result may name nothing else)
SP = "savepoints/savepoint-3-ab12cd34"


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
    request = channel.submit("savepoint", generation=4, timeout_s=60, requested_by="test")
    assert request.job == "orders" and request.deadline == pytest.approx(request.created_at + 60)
    assert channel.result(request.id).state == "pending"
    assert [r.id for r in channel.pending()] == [request.id]
    assert [r.id for r in channel.pending(generation=4)] == [request.id]
    assert channel.pending(generation=5) == []

    job_side = ControlChannel(Catalog(catalog.storage, "orders"))  # another process's view
    taken = job_side.pending(generation=4)[0]
    assert taken == request
    job_side.acknowledge(taken, 4)
    with pytest.raises(ObjectExists):
        job_side.acknowledge(taken, 4)
    assert channel.pending() == []
    assert channel.result(request.id).state == "acknowledged"
    assert channel.result(request.id).generation == 4

    job_side.complete(taken, generation=4, savepoint=SP, batch_id=12)
    job_side.complete(taken, generation=4, savepoint=SP, batch_id=12)  # repeat: no-op
    result = channel.wait(request.id, timeout_s=5, poll_s=0.01)
    assert (result.state, result.generation, result.savepoint, result.batch_id) == ("completed", 4, SP, 12)


def test_pending_is_oldest_first_and_filters_generation(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    first = channel.submit("savepoint", generation=2)
    second = channel.submit("stop", generation=3)
    third = channel.submit("cancel", generation=3)
    assert [r.id for r in channel.pending()] == [first.id, second.id, third.id]
    assert [r.id for r in channel.pending(generation=3)] == [second.id, third.id]
    assert [r.id for r in channel.pending(generation=2)] == [first.id]
    with pytest.raises(ControlError, match="addressed to generation 2, not 3"):
        channel.acknowledge(first, 3)


def test_fail_makes_wait_raise(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1)
    channel.acknowledge(request, 1)
    channel.fail(request, generation=1, error="state store commit failed")
    assert channel.result(request.id).state == "failed"
    with pytest.raises(ControlError,
                       match=rf"stop request {request.id} of job 'orders' failed in generation 1: "
                             "state store commit failed"):
        channel.wait(request.id, timeout_s=5, poll_s=0.01)
    with pytest.raises(ControlError, match="already has a result"):
        channel.complete(request, generation=1, savepoint=SP)


def test_fail_without_ack_claims_the_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("cancel", generation=1)
    channel.fail(request, generation=None, error="cancel is not supported by this sink")
    assert channel.pending() == []
    with pytest.raises(ObjectExists):
        channel.acknowledge(request, 1)
    assert channel.result(request.id).error == "cancel is not supported by this sink"


def test_complete_needs_the_acknowledging_generation(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1)
    with pytest.raises(ControlError, match="taken by nobody"):
        channel.complete(request, generation=1)
    channel.acknowledge(request, 1)
    with pytest.raises(ControlError, match="taken by generation 1"):
        channel.complete(request, generation=2)


def test_expired_request_is_not_pending_and_wait_raises(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1, timeout_s=0.05)
    time.sleep(0.1)
    assert channel.pending() == []
    assert channel.result(request.id).state == "expired"
    with pytest.raises(ControlError, match="acknowledge|expired"):
        channel.acknowledge(request, 1)
    with pytest.raises(ControlError, match=rf"savepoint request {request.id} of job 'orders' expired"):
        channel.wait(request.id, timeout_s=5, poll_s=0.01)


def test_wait_raises_promptly_when_the_job_is_dead(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1, timeout_s=600)
    started = time.monotonic()
    with pytest.raises(ControlError,
                       match=rf"stop request {request.id} of job 'orders' was not taken: the job is not"):
        channel.wait(request.id, timeout_s=60, poll_s=0.5, is_alive=lambda: False)
    assert time.monotonic() - started < 2
    # withdrawn: a job started later never acts on it
    assert channel.pending() == []
    assert channel.result(request.id).state == "expired"


def test_wait_after_ack_and_job_death_says_so(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=7)
    channel.acknowledge(request, 7)
    with pytest.raises(ControlError, match="acknowledged by generation 7 but the job stopped"):
        channel.wait(request.id, timeout_s=60, poll_s=0.01, is_alive=lambda: False)


def test_result_written_before_the_job_exits_wins_over_liveness(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1)
    channel.acknowledge(request, 1)
    channel.complete(request, generation=1, savepoint=SP)
    assert channel.wait(request.id, timeout_s=1, is_alive=lambda: False).savepoint == SP


def test_wait_timeout_withdraws_an_untaken_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1, timeout_s=600)
    with pytest.raises(ControlError, match=r"timed out after 0.1 s: no job acknowledged it"):
        channel.wait(request.id, timeout_s=0.1, poll_s=0.02)
    assert channel.pending() == []


def test_wait_timeout_on_an_acknowledged_request(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=2)
    channel.acknowledge(request, 2)
    with pytest.raises(ControlError, match="acknowledged by generation 2 but not finished"):
        channel.wait(request.id, timeout_s=0.05, poll_s=0.01)


def test_wait_sees_completion_by_another_thread(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1)

    def job() -> None:
        worker = ControlChannel(Catalog(catalog.storage, "orders"))
        while not worker.pending(1):
            time.sleep(0.01)
        taken = worker.pending(1)[0]
        worker.acknowledge(taken, 1)
        worker.complete(taken, generation=1, savepoint=SP, batch_id=3)

    thread = threading.Thread(target=job)
    thread.start()
    try:
        assert channel.wait(request.id, timeout_s=10, poll_s=0.02, is_alive=lambda: True).batch_id == 3
    finally:
        thread.join()


def test_two_jobs_racing_to_acknowledge_only_one_wins(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1)
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def take(worker_id: int) -> None:
        worker = ControlChannel(Catalog(catalog.storage, "orders"))
        barrier.wait()
        try:
            worker.acknowledge(request, 1)
        except ObjectExists:
            return
        wins.append(worker_id)

    threads = [threading.Thread(target=take, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert channel.result(request.id).state == "acknowledged"


def test_bad_input(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    with pytest.raises(ConfigError,
                       match=r"kind 'restart' is invalid; expected one of savepoint, stop, cancel"):
        channel.submit("restart", generation=1)
    with pytest.raises(ConfigError, match="timeout_s=0"):
        channel.submit("stop", generation=1, timeout_s=0)
    with pytest.raises(ConfigError, match="generation=0"):
        channel.submit("stop", generation=0)
    with pytest.raises(ConfigError, match="request id '../x' is invalid"):
        channel.result("../x")
    with pytest.raises(ControlError, match="does not exist"):
        channel.result("0001700000000-abcdef01")
    with pytest.raises(ConfigError, match="older_than_s=-1"):
        channel.cleanup(-1)
    with pytest.raises(ConfigError, match="limit=0 is invalid"):
        channel.cleanup(limit=0)


def test_cleanup_removes_finished_and_expired_only(catalog: Catalog) -> None:
    clock = [1_800_000_000.0]
    channel = ControlChannel(catalog)
    channel.clock = lambda: clock[0]
    done = channel.submit("savepoint", generation=1, timeout_s=60)
    channel.acknowledge(done, 1)
    channel.complete(done, generation=1, savepoint=SP)
    expired = channel.submit("stop", generation=1, timeout_s=10)
    live = channel.submit("savepoint", generation=1, timeout_s=3600)
    working = channel.submit("savepoint", generation=1, timeout_s=3600)
    channel.acknowledge(working, 1)
    clock[0] += 100
    assert channel.cleanup(older_than_s=3600) == 0
    assert channel.cleanup(older_than_s=0) == 2
    remaining = {info.key.split("/")[-1].split(".")[0] for info in catalog.store.list("control")}
    assert remaining == {live.id, working.id}
    assert expired.id not in remaining
    assert [r.id for r in channel.pending()] == [live.id]


def test_cleanup_takes_the_oldest_first_up_to_its_limit_and_reads_no_young_request(catalog: Catalog) -> None:
    """What a long-running job's hourly pass relies on: a backlog goes in bounded steps,
    oldest first, and requests made within the window cost no read at all."""
    clock = [1_800_000_000.0]
    channel = ControlChannel(catalog)
    channel.clock = lambda: clock[0]
    old = []
    for _ in range(5):
        request = channel.submit("savepoint", generation=1)
        channel.acknowledge(request, 1)
        channel.complete(request, generation=1, savepoint=SP)
        old.append(request.id)
        clock[0] += 10
    clock[0] += 2 * 86400
    young = [channel.submit("savepoint", generation=1).id for _ in range(3)]
    reader = ControlChannel(Catalog(catalog.storage, "orders"))  # no cache: every read is a GET
    reader.clock = channel.clock
    reads: list[str] = []
    get = reader.store.get
    reader.store.get = lambda key, *a, **kw: reads.append(key) or get(key, *a, **kw)  # type: ignore[method-assign]

    assert reader.cleanup(limit=2) == 2
    assert sorted(reader.request_ids()) == sorted(old[2:] + young), "the oldest two go first"
    assert reader.cleanup(limit=2) == 2
    assert reader.cleanup(limit=2) == 1
    assert reader.cleanup(limit=2) == 0

    assert sorted(reader.request_ids()) == sorted(young), "the young (pending) requests stay"
    assert not [key for key in reads if any(y in key for y in young)], "a young request was read"


def test_cleanup_keeps_a_finished_request_until_its_deadline_is_as_long_past(catalog: Catalog) -> None:
    """A removal cut short leaves the request file (deleted last): were its deadline still
    ahead, `pending` would offer it again. So a request answered early but with a long
    timeout stays until the deadline is `older_than_s` past too."""
    clock = [1_800_000_000.0]
    channel = ControlChannel(catalog)
    channel.clock = lambda: clock[0]
    request = channel.submit("savepoint", generation=1, timeout_s=3 * 86400)
    channel.acknowledge(request, 1)
    channel.complete(request, generation=1, savepoint=SP)
    clock[0] += 2 * 86400
    assert channel.cleanup() == 0, "answered two days ago, but its deadline is a day ahead"
    clock[0] += 2 * 86400
    assert channel.cleanup() == 1


# ---------------------------------------------------------------------------- generations (issue #19)


def _legacy_request(catalog: Catalog, kind: str = "stop") -> ControlRequest:
    """A request with no generation, as `on_kill` of earlier releases filed it."""
    import json

    now = time.time()
    request = ControlRequest(f"{int(now * 1000):013d}-0badc0de", kind, catalog.job, now, now + 60, None,
                             "on_kill:t")
    catalog.store.put(f"control/{request.id}.request.json", json.dumps(request.to_json()).encode())
    return request


@pytest.mark.parametrize("kind", ["savepoint", "stop", "cancel"])
def test_a_request_must_name_its_generation(catalog: Catalog, kind: str) -> None:
    channel = ControlChannel(catalog)
    with pytest.raises(ConfigError, match=rf"{kind} request needs generation=<the live run's generation>"):
        channel.submit(kind, generation=None)  # type: ignore[arg-type]
    assert channel.pending() == []


def test_a_run_serves_only_requests_addressed_to_its_generation(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    legacy = _legacy_request(catalog)
    mine = channel.submit("savepoint", generation=2)
    newer = channel.submit("stop", generation=3)
    assert [r.id for r in channel.pending(2)] == [mine.id]
    assert [r.id for r in channel.pending(3)] == [newer.id]
    assert [r.id for r in channel.pending()] == [legacy.id, mine.id, newer.id]  # the requester's view: all
    with pytest.raises(ControlError, match="addressed to no generation"):
        channel.acknowledge(legacy, 2)


def test_a_killed_runs_stop_request_is_withdrawn_by_its_successor_never_served(catalog: Catalog) -> None:
    """Issue #19: a stop request left for a run that was killed must not stop the next run."""
    channel = ControlChannel(catalog)
    legacy = _legacy_request(catalog)  # an earlier release's on_kill: no generation
    dead = channel.submit("stop", generation=1, requested_by="savepoint operator of a killed try")
    mine = channel.submit("savepoint", generation=2)
    newer = channel.submit("savepoint", generation=3)

    job_side = ControlChannel(Catalog(catalog.storage, catalog.job))
    withdrawn = job_side.withdraw_superseded(2)

    assert sorted(withdrawn) == sorted([legacy.id, dead.id])
    assert [r.id for r in channel.pending()] == [mine.id, newer.id]
    old = channel.result(dead.id)
    assert old.state == "expired" and old.generation == 1
    assert old.error is not None and "addressed to generation 1, superseded by generation 2" in old.error
    assert "addressed to no generation" in (channel.result(legacy.id).error or "")
    with pytest.raises(ObjectExists):  # sealed: a late zombie of generation 1 cannot take it either
        channel.acknowledge(dead, 1)
    with pytest.raises(ControlError,
                       match=rf"stop request {dead.id} of job 'orders' expired: addressed to generation 1"):
        channel.wait(dead.id, timeout_s=1, poll_s=0.01)
    assert job_side.withdraw_superseded(2) == []  # idempotent
