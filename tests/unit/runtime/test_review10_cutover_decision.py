"""Review (issue 49, review10): the cutover's decision record (wt-calloff) and the
agreement's freshness rule, against the real classes on the in-memory store.

1. A zero-downtime cutover is how a new release is deployed: green runs the new release
   while the orchestrator (Airflow's provider) may still run the one before, which
   writes ``done: aborted`` with no decision. Green decides ``claim`` and writes its
   origin; its ``claimed`` record is refused: the cutover reads claimed by green and
   aborted, and green dies with its origin written.
2. `CutoverProgress.fresh` measured green's record's age (green's clock, ``updated_at``)
   on the orchestrator's clock: a dead green whose clock ran ahead was agreed with, as
   before 81c801b, and a live one whose clock ran behind never was. Fixed (wt-clock10):
   the age is the time since the drive saw the record change, on its own clock.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverEnd, CutoverProgress, CutoverStore
from airflow_sparkpoint.exceptions import CutoverError
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.services.zero_downtime import drive_cutover, plan_cutover
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.cutover_actors import Blue, Polling, blue_stopped_after
from tests.support.fake_sinks import FakeSink


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


@pytest.mark.xfail(strict=True, reason=(
    "finding (review10): a call-off of the release before the decision record (done: aborted, no "
    "decision) after green's claim decision: the cutover reads claimed by green and aborted, green's "
    "origin is written and its claimed record refused"))
def test_a_call_off_of_the_release_before_after_green_s_decision_leaves_no_contradiction(
        catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Green (this release) decided ``claim`` for generation 2; the orchestrator of the
    release before calls the cutover off right then: it reads no ``claimed`` record and
    writes ``done: aborted`` (its `end` takes no decision), then asks for blue's restart.
    Green writes its origin and is refused its ``claimed`` record ("is done"). The cutover
    now reads green's generation 2 (`taken`, from the decision) and outcome aborted, the
    contradiction the decision record was made to close; `cutover list` shows both."""
    sink, cid = blue_stopped_after(catalog)
    store = CutoverStore(catalog)
    write_origin = catalog.write_origin

    def old_call_off_meanwhile(origin: object) -> None:
        if store.read(cid).done is None:  # the release before's call_off: reads no claimed, ends aborted
            store._create(cid, "done", CutoverEnd(cid, "aborted", "stop", "old call-off", by="old",
                                                  at=time.time()).to_json())
        write_origin(origin)  # type: ignore[arg-type]

    monkeypatch.setattr(catalog, "write_origin", old_call_off_meanwhile)
    try:
        adopt(catalog, sink, cid, live_dir=None)
    except CutoverError:
        pass  # green is refused its claimed record after its origin (on main)
    monkeypatch.undo()
    state = store.read(cid)
    assert state.decision is not None and state.decision.outcome == "claim", state.decision
    ended = state.ended
    assert not (state.taken is not None and ended is not None and ended.outcome == "aborted"), (
        f"cutover {cid} reads taken by generation {state.taken.generation if state.taken else None} and "
        f"ended {ended.outcome if ended else None}; list shows {state.to_json()}; origins of generation 2: "
        f"{[o.uri for o in catalog.origins() if o.generation == 2]}")


def test_a_dead_green_whose_clock_runs_ahead_is_not_agreed_with(catalog: Catalog) -> None:
    """As test_cutover_drive_windows' dead-green test, but green's host clock ran two
    hours ahead: its last record, written an hour ago, carries a time an hour in the
    orchestrator's future, and read fresh (``now - updated_at`` < 0): the drive agreed,
    blue stopped after N, no green ever claimed, and the claim bound called the cutover
    off with blue stopped (a person restarts the job). The record is never seen to
    change: the warm-up's bound calls the cutover off with blue untouched."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, pace_s=10.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=1.0).plan.id
    blue_last = int((catalog.read_status() or {}).get("last_batch") or 0)
    skew = 7200.0  # green's clock ahead of the orchestrator's
    CutoverStore(catalog).progress(CutoverProgress(cid, blue_last, 0.5, 7,
                                                   updated_at=time.time() - 3600 + skew))
    try:
        drive_cutover(catalog, cid, within_s=0.5, requested_by="test", poll_s=0.02)
    except CutoverError:
        pass  # called off: expected, as long as blue was not asked to stop
    finally:
        blue.stop.set()
        blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is None and blue.stopped_at is None, (
        f"agreed {state.agreed} on a progress record written an hour ago by a clock {skew:.0f} s ahead; "
        f"blue stopped after {blue.stopped_at}; the cutover {state.step} at "
        f"{state.ended.step if state.ended else None}")


def test_a_live_green_whose_clock_runs_behind_is_agreed_with(catalog: Catalog) -> None:
    """The other direction of the skew: green's host clock runs two hours behind the
    orchestrator's. Green is alive and caught up, rewriting its progress record at every
    poll of blue, each record carrying a time two hours in the orchestrator's past; its
    record's age is read on the orchestrator's clock (seen to change), so it is agreed with."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, pace_s=10.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=0.5).plan.id
    blue_last = int((catalog.read_status() or {}).get("last_batch") or 0)
    skew = -7200.0  # green's clock behind the orchestrator's
    try:
        with Polling(catalog, lambda: CutoverProgress(cid, blue_last, 0.5, 7, updated_at=time.time() + skew)):
            drive_cutover(catalog, cid, within_s=3.0, requested_by="test", poll_s=0.02)
    except CutoverError:
        pass  # blue (10 s a batch) does not reach N within the stop bound: called off after the agreement
    finally:
        blue.stop.set()
        blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is not None, (
        f"no agreement with a live green whose clock runs {-skew:.0f} s behind; the cutover {state.step} at "
        f"{state.ended.step if state.ended else None}: {state.ended.reason if state.ended else None}")


@pytest.mark.xfail(strict=True, reason=(
    "finding (review10): a green of the release before the decision record (origin, then claimed, no "
    "decision) racing this release's call-off: the cutover reads claimed by green and aborted"))
def test_a_green_of_the_release_before_racing_a_call_off_leaves_no_contradiction(
        catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other direction of the upgrade window: the orchestrator runs this release, green
    the one before (its adopt reads ``done``, writes its origin and ``claimed``, and takes
    no decision). The call-off takes ``abort``; green, between that and the call-off's end,
    finds no done record and claims; the call-off then ends the cutover aborted and asks
    for blue's restart while green runs as the job."""
    import airflow_sparkpoint.services.cutover as services_cutover
    from airflow_sparkpoint.checkpoints.cutover import CutoverClaim
    from airflow_sparkpoint.services.cutover import call_off

    _sink, cid = blue_stopped_after(catalog)
    store = CutoverStore(catalog)
    withdraw = services_cutover.withdraw_stop_after
    claimed: list[int] = []

    def old_green_claims_meanwhile(*args: object, **kwargs: object) -> list[str]:
        if not claimed and store.read(cid).done is None:  # the release before's adopt: no done record yet
            green = catalog.claim_generation_after(1, {"cutover": cid})
            assert green is not None
            store._create(cid, "claimed", CutoverClaim(cid, green.generation, 3,
                                                       "memory://x/orders/chk-2").to_json())
            claimed.append(green.generation)
        return withdraw(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(services_cutover, "withdraw_stop_after", old_green_claims_meanwhile)
    try:
        call_off(catalog, cid, reason="task was killed", by="on_kill")
    except CutoverError:
        pass
    monkeypatch.undo()
    assert claimed, "the race did not happen"
    state = store.read(cid)
    ended = state.ended
    assert not (state.claimed is not None and ended is not None and ended.outcome == "aborted"), (
        f"cutover {cid} is claimed by generation {state.claimed.generation if state.claimed else None} "
        f"and ended {ended.outcome if ended else None}; list shows {state.to_json()}")
