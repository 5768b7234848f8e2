"""The orchestrator's use case of a zero-downtime cutover (`services.zero_downtime`):
plan from blue's newest checkpoint (green's settings), then drive it — warm-up within
the lag, agreement of N ahead of blue, blue's stop after N, green's claim, green's first
commit — on a real (in-memory) store, with a blue that serves its control requests and
a green that reports progress, claims (`runtime.cutover.adopt`) and commits through
the real committer, each on its own thread. No Spark."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverProgress, CutoverStore
from airflow_sparkpoint.exceptions import CatalogError, ConfigError, CutoverError
from airflow_sparkpoint.services.zero_downtime import drive_cutover, plan_cutover
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.cutover_actors import Blue, Green, Polling
from tests.support.fake_sinks import FakeSink


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


def _drive(catalog: Catalog, cid: str, steps: list[str], **kw: object) -> Callable[[], object]:
    options: dict[str, object] = {"within_s": 20.0, "requested_by": "test", "margin": 2, "poll_s": 0.02}
    options.update(kw)
    return lambda: drive_cutover(catalog, cid, on_step=steps.append, **options)  # type: ignore[arg-type]


def test_the_cutover_is_driven_from_warm_up_to_green_s_first_commit_every_batch_once(
    catalog: Catalog
) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)
    blue.thread.start()
    start = plan_cutover(catalog, green_root="memory://scratch", requested_by="test", reach_timeout_s=20.0)
    cid = start.plan.id
    assert start.settings == {
        "spark.sparkpoint.shadow.mode": "discard", "spark.sparkpoint.shadow.dir": f"memory://scratch/{cid}",
        "spark.sparkpoint.shadow.job": "orders-shadow", "spark.sparkpoint.shadow.from": start.plan.warmup_uri,
        "spark.sparkpoint.cutover": cid}
    green = Green(catalog, sink, cid)
    green.thread.start()
    steps: list[str] = []
    outcome = _drive(catalog, cid, steps)()
    green.thread.join(10)
    blue.stop.set()
    blue.thread.join(10)
    assert green.error is None, repr(green.error)

    n = outcome.after_batch  # type: ignore[attr-defined]
    assert blue.stopped_at == n
    assert (outcome.step, outcome.blue_generation, outcome.green_generation) == ("committed", 1, 2)  # type: ignore[attr-defined]
    # Every batch committed once: through N by blue, N+1 by green (the oracle: batch ids and owners).
    assert (sink.world["committed"]
            == {**{b: f"orders-b{b}-g1" for b in range(n + 1)}, n + 1: f"orders-b{n + 1}-g2"})
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.claimed.generation) == ("committed", 2)  # type: ignore[union-attr]
    # Each step in the task log, in order.
    prefix = f"cutover {cid}: "
    assert all(s.startswith(prefix) for s in steps), steps
    kinds = [s[len(prefix):].split(":")[0].split(" (")[0] for s in steps]
    assert [k for k in kinds if k != "warm-up"] == [
        "planned", "agreed", "blue", "green claimed the job as generation 2 at batch " + str(n),
        "green committed its first batch into the job's sinks"], steps
    assert "warm-up" in kinds

def test_a_green_that_does_not_catch_up_calls_the_cutover_off_and_leaves_blue_running(
    catalog: Catalog
) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test").plan.id
    green = Green(catalog, sink, cid, follows=False)
    green.thread.start()
    steps: list[str] = []
    with pytest.raises(CutoverError, match="did not come within 2 batch.*blue keeps running, untouched"):
        _drive(catalog, cid, steps, within_s=0.5)()
    green.thread.join(10)
    assert blue.thread.is_alive() and blue.stopped_at is None  # never asked to stop
    blue.stop.set()
    blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert (state.step, state.done.step) == ("aborted", "warmup")  # type: ignore[union-attr]
    assert ControlChannel(catalog).pending() == [] and state.agreed is None


def _slow_blue_at_batch_1(catalog: Catalog) -> tuple[Blue, str, int]:
    """Blue with a batch every 10 s, a cutover planned beside it, once blue reached its
    batch 1 (or 10 s passed): (blue, the cutover's id, blue's last batch)."""
    blue = Blue(catalog, FakeSink(f"s-{uuid.uuid4().hex[:8]}"), pace_s=10.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=1.0).plan.id
    deadline = time.time() + 10
    while int((catalog.read_status() or {}).get("last_batch") or 0) < 1 and time.time() < deadline:
        time.sleep(0.01)
    return blue, cid, int((catalog.read_status() or {}).get("last_batch") or 0)


def test_green_behind_blue_before_its_first_replay_is_not_agreed_with(catalog: Catalog) -> None:
    """Green reports the batch it warms up from before it replayed anything: within the
    lag on paper, but behind blue with its first query start (the slow one: seconds)
    still ahead, so an agreement then would let blue reach N long before green (the
    output gap of `benchmarks/bench_cutover_gap.py`: 5-8 s). No agreement until green
    replayed one of blue's batches."""
    blue, cid, blue_last = _slow_blue_at_batch_1(catalog)
    assert blue_last == 1  # blue's batch 1 (its next comes 10 s later)
    CutoverStore(catalog).progress(CutoverProgress(cid, 0))  # one batch behind (lag 2), no replay yet
    steps: list[str] = []
    with pytest.raises(CutoverError,
                       match="did not come within 2 batch.*replayed none of blue's batches.*blue "
                             "keeps running, untouched"):
        _drive(catalog, cid, steps, within_s=0.5)()
    assert blue.thread.is_alive() and blue.stopped_at is None  # never asked to stop
    blue.stop.set()
    blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is None and ControlChannel(catalog).pending() == []
    assert any("no replay yet" in step for step in steps), steps


def test_green_at_an_idle_blue_s_batch_is_agreed_with_before_any_replay(catalog: Catalog) -> None:
    """Blue idle at the checkpoint green warms up from: nothing to replay, and blue
    reaches N only with new input, which green replays too; the agreement does not wait
    for a replay that only that input brings (a sparse stream would never cut over)."""
    blue, cid, _ = _slow_blue_at_batch_1(catalog)
    # at blue's batch 1, no replay; rewritten at every poll of blue (a live green's record changes)
    with Polling(catalog, lambda: CutoverProgress(cid, 1)), \
            pytest.raises(CutoverError, match="blue did not stop after batch 3"):
        _drive(catalog, cid, [], within_s=5.0)()  # agreed at once: N = 1 + 2; blue's pace never gets there
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is not None and state.agreed.after_batch == 3
    blue.stop.set()
    blue.thread.join(10)


def test_a_green_that_does_not_claim_after_blue_stopped_calls_it_off_and_says_restore_latest(
    catalog: Catalog
) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=1.0).plan.id
    green = Green(catalog, sink, cid, claims=False)
    green.thread.start()
    with pytest.raises(CutoverError, match="did not take the job over within 1 s.*restore=latest"):
        _drive(catalog, cid, [])()
    blue.thread.join(10)
    assert blue.stopped_at is not None and catalog.current_generation() == 1  # nothing claimed
    assert CutoverStore(catalog).read(cid).done.step == "stop"  # type: ignore[union-attr]


def test_the_comparison_gate_refuses_on_green_s_first_difference(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, pace_s=10.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test", mode="compare").plan.id
    CutoverStore(catalog).progress(CutoverProgress(cid, 0, verified_batch=0,
                                                   difference="batch 1: rows only green has: [u4]"))
    with pytest.raises(CutoverError,
                       match="comparison gate found a difference: batch 1: rows only green has"):
        _drive(catalog, cid, [])()
    assert blue.stopped_at is None
    blue.stop.set()
    blue.thread.join(10)


def test_bad_input_is_refused_before_anything_is_written(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match="has no live run"):
        plan_cutover(catalog, green_root="memory://scratch", requested_by="test")
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    Blue(catalog, sink, config={"trigger": "availableNow"})  # its status says running
    with pytest.raises(ConfigError, match="trigger='availableNow'.*processingTime"):
        plan_cutover(catalog, green_root="memory://scratch", requested_by="test")
    with pytest.raises(ConfigError, match="cutover mode='mirror'"):
        plan_cutover(catalog, green_root="memory://scratch", requested_by="test", mode="mirror")
    assert CutoverStore(catalog).ids() == []
    with pytest.raises(ConfigError, match="cutover margin=0"):
        drive_cutover(catalog, "1764370000000-0123abcd", within_s=1, requested_by="t", margin=0)


def test_a_drive_started_again_after_the_agreement_resumes_it_instead_of_refusing(catalog: Catalog) -> None:
    """An orchestrator lost after agreeing N (a worker restart): the next drive finds the
    agreement in the records and waits for blue's stop after that N; no second request."""
    from airflow_sparkpoint.services.cutover import stop_after_batch

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, pace_s=10.0)
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=20.0).plan.id
    # The lost orchestrator's agreement: blue's request filed, then N recorded.
    stop = stop_after_batch(catalog, 2, timeout_s=20.0, poll_s=0.02, max_heartbeat_age=60.0,
                            requested_by="test", wait=False, generation=1, cutover_id=cid)
    agreed = CutoverStore(catalog).agree(cid, 2, stop.request_id)
    blue.thread.start()
    green = Green(catalog, sink, cid)
    green.thread.start()
    steps: list[str] = []
    outcome = _drive(catalog, cid, steps)()
    green.thread.join(10)
    blue.thread.join(10)
    assert green.error is None, repr(green.error)
    assert (outcome.step, outcome.after_batch) == ("committed", agreed.after_batch)  # type: ignore[attr-defined]
    assert blue.stopped_at == agreed.after_batch and CutoverStore(catalog).read(cid).agreed == agreed
    assert any("resumed: agreed already" in s for s in steps), steps


@pytest.mark.parametrize(("lag", "shown"), [(-1, "-1"), (True, "True"), (1.5, "1.5"), ("2", "'2'")])
def test_a_bad_lag_is_refused_by_the_service_before_the_catalog_is_read(
    catalog: Catalog, lag: object, shown: str
) -> None:
    """Issue #47: the lag bound is the service's rule, not only the pre-flight operator's:
    any caller (a CLI, a DAG calling the service) gets the ConfigError naming the value,
    even for a job with no live run, and nothing is written."""
    expected = rf"lag_batches={re.escape(shown)} is invalid; expected an integer >= 0"
    with pytest.raises(ConfigError, match=expected):
        plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                     lag_batches=lag)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"reach_timeout_s=0 is invalid"):
        plan_cutover(catalog, green_root="memory://scratch", requested_by="test", reach_timeout_s=0)
    assert CutoverStore(catalog).ids() == []
