"""Review of the cutover's drive (issue 49, `services.zero_downtime` as look/advance):
windows where the drive leaves the cutover in a state a person must repair, played
through real records (blue and green as in test_cutover_drive.py). No Spark."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverProgress, CutoverStore
from airflow_sparkpoint.exceptions import CutoverError
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.services.cutover import call_off, stop_after_batch
from airflow_sparkpoint.services.zero_downtime import drive_cutover, plan_cutover
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.cutover_actors import Blue, Green, blue_stopped_after
from tests.support.deaths import Died
from tests.support.fake_sinks import FakeSink


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


def _requests_of(catalog: Catalog, cid: str) -> list[str]:
    channel = ControlChannel(catalog)
    return [i for i in channel.request_ids()
            if channel.read_request(i).kind == "stop_after" and channel.read_request(i).cutover == cid]



def test_the_claim_bound_is_not_measured_on_blue_s_clock(catalog: Catalog) -> None:
    """Blue's host clock 60 s behind the orchestrator's; green claims 0.5 s after blue's
    stop, well within the plan's 20 s reach bound. The claim's deadline is computed from
    blue's completion record (`updated_at`, blue's clock) + reach: already passed when the
    orchestrator sees the stop, so it calls the cutover off at once, blue stopped after N
    (a person restarts it). The code before 2507552 measured the bound on the
    orchestrator's own clock from the moment it saw blue's stop. Green commits at once, so
    the drive ends at its first commit instead of waiting the 20 s bound out."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, clock_offset_s=-60.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=20.0).plan.id
    green = Green(catalog, sink, cid, commits=True, claim_after_s=0.5)
    green.thread.start()
    try:
        outcome = drive_cutover(catalog, cid, within_s=20.0, requested_by="test", poll_s=0.02)
    except CutoverError as exc:
        pytest.fail(f"called off although green claimed within the bound: {exc}")
    finally:
        green.thread.join(10)
        blue.stop.set()
        blue.thread.join(10)
    assert outcome.step == "claimed" or outcome.step == "committed", outcome
    assert green.error is None and green.claimed == 2, repr(green.error)



def test_a_drive_started_again_after_a_lost_agreement_files_no_second_stop_after(catalog: Catalog) -> None:
    """The orchestrator died between blue's stop_after request and the agreed record
    (fault point cutover_agreement). Its retry (resume_position: not agreed, so warm-up)
    agrees again: a second stop_after request for the same cutover, with another N.
    Blue takes the first (it names the open cutover) and stops after its N; the second
    is never taken; the cutover is called off with blue stopped (a person restarts it).
    PROTOCOL.md says the retry calls the cutover off instead; a resume could adopt the
    filed request as the agreement."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)  # its status says running; it serves requests once its thread starts
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=5.0).plan.id
    lost = stop_after_batch(catalog, 3, timeout_s=5.0, poll_s=0.02, max_heartbeat_age=60.0,
                            requested_by="lost", wait=False, generation=1, cutover_id=cid)
    green = Green(catalog, sink, cid, commits=False)
    green.thread.start()
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            drive_cutover(catalog, cid, within_s=20.0, requested_by="retry", poll_s=0.02)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    deadline = time.time() + 10
    while CutoverStore(catalog).read(cid).agreed is None and driver.is_alive() and time.time() < deadline:
        time.sleep(0.02)
    filed = _requests_of(catalog, cid)
    blue.thread.start()
    driver.join(15)
    green.thread.join(10)
    blue.stop.set()
    blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert filed == [lost.request_id], (
        f"the retry filed a second stop_after for cutover {cid}: {filed}; agreed "
        f"{state.agreed}; blue took {blue.taken}, stopped after {blue.stopped_at}; the drive ended with "
        f"{errors}; the cutover {state.step}")



def test_a_call_off_after_blue_stopped_for_the_cutover_does_not_say_blue_keeps_running(
    catalog: Catalog
) -> None:
    """The orchestrator died after filing blue's stop_after (cutover_agreement); blue took
    it and stopped after its N. The retry's warm-up finds blue not running and calls the
    cutover off saying 'blue keeps running, untouched': blue is stopped and must be
    started again with restore=latest (PROTOCOL.md: 'or stops after N and is restarted')."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test").plan.id
    stop_after_batch(catalog, 3, timeout_s=20.0, poll_s=0.02, max_heartbeat_age=60.0, requested_by="lost",
                     wait=False, generation=1, cutover_id=cid)
    blue.thread.start()
    blue.thread.join(10)
    assert blue.stopped_at == 3  # the fault happened: blue stopped after the lost orchestrator's N
    with pytest.raises(CutoverError) as raised:
        drive_cutover(catalog, cid, within_s=5.0, requested_by="retry", poll_s=0.02)
    message = str(raised.value)
    assert "blue keeps running, untouched" not in message and "restore=latest" in message, message



def test_a_call_off_racing_green_s_claim_never_ends_a_claimed_cutover(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_kill (or a bound) calls the cutover off while green claims: call_off reads the
    records (no claim yet); green's adopt runs right after that read (its own checks see
    the cutover open) and claims; then call_off acts on what it read. On the code before
    the decision record the cutover ended both claimed by green (whose run goes on as the
    job) and aborted (the task log told the user to restart blue with restore=latest)."""
    sink, cid = blue_stopped_after(catalog)
    read = CutoverStore.read
    claimed: list[object] = []

    def green_claims_meanwhile(self: CutoverStore, cutover_id: str) -> object:
        state = read(self, cutover_id)
        if not claimed and state.claimed is None:  # green's adopt between call_off's read and its writes
            claimed.append(None)  # before adopt: its own reads go through here
            claimed[0] = adopt(catalog, sink, cid, live_dir=None)
        return state

    monkeypatch.setattr(CutoverStore, "read", green_claims_meanwhile)
    try:
        call_off(catalog, cid, reason="task was killed", by="on_kill")
    except CutoverError as exc:
        assert "green" in str(exc), exc  # refused: green's claim stands (what call_off promises)
    monkeypatch.setattr(CutoverStore, "read", read)
    state = CutoverStore(catalog).read(cid)
    assert claimed and claimed[0] is not None, \
        "the race did not happen: green did not claim during the call-off"
    assert not (state.claimed is not None and state.done is not None and state.done.outcome == "aborted"), (
        f"cutover {cid} is claimed by generation {state.claimed.generation if state.claimed else None} "
        f"and ended {state.done}")
    assert state.step == "claimed" and state.to_json()["green_generation"] == 2, state.to_json()


def test_green_that_lost_the_decision_to_a_call_off_writes_no_origin(catalog: Catalog,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The call-off lands after green's claim of generation 2 and its checks after it,
    before green decides: the call-off's decision stands, green fails with an error that
    says so and writes no origin (its claim fenced a stopped blue: restore=latest resumes
    blue's lineage at N), and the cutover reads aborted, never claimed."""
    sink, cid = blue_stopped_after(catalog)
    position = sink.committed_position
    ended: list[object] = []

    def call_off_meanwhile(job: str) -> int | None:
        if not ended:  # green's last check before its decision: the call-off comes in here
            ended.append(call_off(catalog, cid, reason="task was killed", by="on_kill"))
        return position(job)

    monkeypatch.setattr(sink, "committed_position", call_off_meanwhile)
    with pytest.raises(CutoverError) as raised:
        adopt(catalog, sink, cid, live_dir=None)
    assert ended, "the race did not happen: the call-off did not run during green's adopt"
    assert "called off" in str(raised.value) and "restore=latest" in str(raised.value), raised.value
    state = CutoverStore(catalog).read(cid)
    assert state.claimed is None and state.done is not None and state.done.outcome == "aborted", state
    assert state.step == "aborted" and state.to_json()["green_generation"] is None, state.to_json()
    assert catalog.current_generation() == 2  # green's claim stays, fencing the stopped blue
    assert all(o.generation != 2 for o in catalog.origins()), catalog.origins()


def test_a_green_dead_after_winning_the_decision_leaves_the_job_green_s(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Green (generation 2) won the decision and died before its origin and ``claimed``.
    The job is green's: a call-off is refused (green's claim stands), green's retry is a
    restart of the job (`taken_over`), other starts are no longer held back by the
    cutover, the orchestrator's look sees the claim, and the first commit of the restart
    ends the cutover committed."""
    from airflow_sparkpoint.runtime.cutover import record_first_commit, taken_over
    from airflow_sparkpoint.runtime.takeover import check_no_cutover
    from airflow_sparkpoint.services.zero_downtime import DrivePosition, look

    sink, cid = blue_stopped_after(catalog)

    def die(_origin: object) -> None:
        raise Died("green's driver was killed")

    monkeypatch.setattr(catalog, "write_origin", die)
    with pytest.raises(Died):
        adopt(catalog, sink, cid, live_dir=None)
    monkeypatch.undo()
    state = CutoverStore(catalog).read(cid)
    assert state.claimed is None and state.done is None  # nothing but the decision: green died in between
    assert state.step == "claimed" and state.to_json()["green_generation"] == 2, state.to_json()
    with pytest.raises(CutoverError, match="claim"):
        call_off(catalog, cid, reason="green did not take the job over in time", by="bound")
    assert CutoverStore(catalog).read(cid).done is None
    assert taken_over(catalog, cid) == 2
    check_no_cutover(catalog)  # the job is green's: the usual start rules apply
    seen = look(catalog, cid, DrivePosition("claim", time.time() + 60, time.time(), 3, "r"),
                max_heartbeat_age=60.0, now=time.time())
    assert (seen.action, seen.generation) == ("claimed", 2), seen
    restart = catalog.claim_generation({"restore": "latest"}).generation  # green's retry (restore=latest)
    end = record_first_commit(catalog, restart, 4)
    assert end is not None and end.outcome == "committed", end
    assert CutoverStore(catalog).read(cid).step == "committed"


def test_a_dead_green_s_progress_record_is_not_agreed_with(catalog: Catalog) -> None:
    """Green replayed up to blue's batch, then died (fault point cutover_warmup; its retry
    warms up from the plan's checkpoint again, its first query start still ahead). Its
    last progress record stays: within the lag, past its first replay, an hour old. The
    agreement rule (`CutoverProgress.within`, `_look_warmup`) took it before it read the
    record's age: blue was asked to stop after N, no green reached N, the cutover was
    called off with blue stopped (a person restarts it). Now the record must be fresh:
    the warm-up's bound calls the cutover off with blue untouched."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink, pace_s=10.0)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test",
                       reach_timeout_s=1.0).plan.id
    blue_last = int((catalog.read_status() or {}).get("last_batch") or 0)
    CutoverStore(catalog).progress(CutoverProgress(cid, blue_last, 0.5, 7, updated_at=time.time() - 3600))
    try:
        drive_cutover(catalog, cid, within_s=0.5, requested_by="test", poll_s=0.02)
    except CutoverError:
        pass  # called off: expected, as long as blue was not asked to stop
    finally:
        blue.stop.set()
        blue.thread.join(10)
    state = CutoverStore(catalog).read(cid)
    assert state.agreed is None and blue.stopped_at is None, (
        f"agreed {state.agreed} on a progress record an hour old; blue stopped after {blue.stopped_at}; "
        f"the cutover {state.step} at {state.done.step if state.done else None}")


def test_a_cutover_claimed_by_the_release_before_the_decision_record_ends_as_before(catalog: Catalog) -> None:
    """A green of the release before wrote ``claimed`` and no decision: the cutover reads
    claimed, a call-off is refused, and green's first commit ends it committed."""
    from airflow_sparkpoint.checkpoints.cutover import CutoverClaim
    from airflow_sparkpoint.runtime.cutover import record_first_commit

    _sink, cid = blue_stopped_after(catalog)
    store = CutoverStore(catalog)
    green = catalog.claim_generation_after(1, {"cutover": cid})
    assert green is not None
    store.claim(CutoverClaim(cid, green.generation, 3, "memory://x/orders/chk-2"))
    state = store.read(cid)
    assert state.decision is None and state.step == "claimed" and state.to_json()["decision"] is None
    with pytest.raises(CutoverError, match="claimed by green"):
        call_off(catalog, cid, reason="late", by="test")
    end = record_first_commit(catalog, green.generation, 4)
    assert end is not None and end.outcome == "committed" and store.read(cid).decision is None


def test_a_cutover_called_off_by_the_release_before_the_decision_record_stays_called_off(
        catalog: Catalog) -> None:
    """A call-off of the release before wrote ``done: aborted`` and no decision: the cutover
    reads aborted, green does not take over (nothing after its generation claim)."""
    from airflow_sparkpoint.checkpoints.cutover import CutoverEnd

    sink, cid = blue_stopped_after(catalog)
    store = CutoverStore(catalog)
    store._create(cid, "done", CutoverEnd(cid, "aborted", "stop", "old call-off", by="old").to_json())
    assert store.read(cid).step == "aborted"
    with pytest.raises(CutoverError, match="is done"):
        adopt(catalog, sink, cid, live_dir=None)
    state = store.read(cid)
    assert state.decision is None and state.claimed is None and catalog.current_generation() == 1


def test_a_call_off_refused_by_green_s_claim_in_phase_stop_reports_the_take_over(catalog: Catalog) -> None:
    """The stop bound passes as blue finishes batch N (its look in phase stop still reads
    the request unfinished) while green decides ``claim``: the drive calls the cutover
    off and is refused ("green's claim stands"). In phase claim that refusal is the
    take-over; in phase stop it failed the task although the job is green's. The drive
    reports the take-over instead: the next look sees green's claim, then its first
    commit is waited for."""
    from airflow_sparkpoint.services.zero_downtime import CutoverDriver, CutoverLook, DrivePosition

    sink, cid = blue_stopped_after(catalog)
    adoption = adopt(catalog, sink, cid, live_dir=None)  # green decides claim and claims generation 2
    store = CutoverStore(catalog)
    agreed = store.read(cid).agreed
    assert agreed is not None
    driver = CutoverDriver(catalog, cid, within_s=60.0, requested_by="test")
    now = time.time()
    stop = DrivePosition("stop", now - 0.1, now - 20, 3, agreed.request_id, steps=("planned",))
    seen = CutoverLook("call_off", f"blue did not stop after batch 3: stop_after request {agreed.request_id} "
                       "timed out after 20 s (acknowledged)", blue_stopped=True)
    try:
        moved = driver.advance(stop, seen, time.time())
    except CutoverError as exc:
        pytest.fail(f"the drive failed although green took the job over: {exc}")
    assert isinstance(moved, DrivePosition) and moved.phase == "claim", moved
    seen = driver.look(moved, time.time())
    assert (seen.action, seen.generation) == ("claimed", adoption.generation), seen
    commit = driver.advance(moved, seen, time.time())
    assert isinstance(commit, DrivePosition) and (commit.phase, commit.green_generation) == ("commit", 2), \
        commit
    assert commit.checkpoint is not None and commit.checkpoint == store.read(cid).taken.checkpoint  # type: ignore[union-attr]
    assert any("green claimed the job as generation 2 at batch 3" in step for step in commit.steps), \
        commit.steps
    state = store.read(cid)
    assert state.done is None and state.step == "claimed", state.to_json()
