"""Green's claim of a job at the end of a cutover (`runtime.cutover.adopt`) and the rule
that refuses every other start while a cutover is open (`runtime.takeover.check_start`),
on a real store with the records a blue that stopped after batch N leaves."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.exceptions import CutoverError, CutoverInProgress
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.runtime.takeover import check_start
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.cutover_records import CID, cutover_plan
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint, transaction_record, write_status

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


def _blue_stopped_after(catalog: Catalog, sink: FakeSink, n: int, *, complete: bool = True) -> str:
    """Blue (generation 1) committed batches 0..n, took its final checkpoint at n and
    completed the cutover's stop_after request; returns the checkpoint's URI."""
    catalog.claim_generation()
    for batch in range(n + 1):
        sink.world["committed"][batch] = f"orders-b{batch}-g1"
    final = put_checkpoint(catalog, batch_id=n, generation=1)
    uri = catalog.checkpoint_uri(final.id)
    store = CutoverStore(catalog)
    store.plan(cutover_plan(warmup_uri=uri, warmup_batch=n))
    channel = ControlChannel(catalog)
    request = channel.submit("stop_after", generation=1, after_batch=n)
    store.agree(CID, n, request.id)
    channel.acknowledge(request, 1)
    if complete:
        channel.complete(request, generation=1, batch_id=n, checkpoint=uri)
    return uri


def test_green_claims_blue_plus_one_with_blue_s_final_checkpoint_as_its_base(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    uri = _blue_stopped_after(catalog, sink, 3)
    leftover = transaction_record(sink, 4, 1, job="orders", created_at=0.0)
    catalog.put_transaction(leftover)  # staged past N by a stalled thread: never confirmed
    adoption = adopt(catalog, sink, CID, live_dir="/work/shadow", adopted_from="memory://shadow/chk-9")
    assert (adoption.generation, adoption.batch_id, adoption.checkpoint_uri) == (2, 3, uri)
    assert adoption.aborted == (4,) and catalog.transactions() == []
    origin = catalog.origins()[-1]
    assert ((origin.generation, origin.base_id, origin.batch_id, origin.uri)
            == (2, adoption.checkpoint.id, 3, uri))
    assert origin.restore["cutover"] == CID and origin.live_dir == "/work/shadow"
    assert catalog.generation_claim(2).details["cutover"] == CID  # type: ignore[union-attr]
    assert CutoverStore(catalog).read(CID).step == "claimed"
    assert catalog.restart_point().checkpoint.id == adoption.checkpoint.id  # type: ignore[union-attr]


def test_green_does_not_claim_before_blue_completed_its_stop(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3, complete=False)
    with pytest.raises(CutoverError,
                       match=r"is acknowledged .*green takes over only after blue stopped at batch 3"):
        adopt(catalog, sink, CID, live_dir=None)
    assert catalog.current_generation() == 1  # nothing written


def test_another_start_since_blue_stopped_ends_the_cutover_not_races_it(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    catalog.claim_generation()  # a retry of blue's task that slipped past check_start
    with pytest.raises(CutoverError, match="generation 2 was claimed by another start"):
        adopt(catalog, sink, CID, live_dir=None)
    assert catalog.current_generation() == 2 and CutoverStore(catalog).read(CID).claimed is None


def test_a_sink_past_n_refuses_green_after_its_claim_and_writes_no_origin(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    sink.world["committed"][4] = "orders-b4-g9"  # someone committed N+1
    before = len(catalog.origins())
    with pytest.raises(CutoverError,
                       match="holds the job's batches through 4, not through the agreed batch 3"):
        adopt(catalog, sink, CID, live_dir=None)
    assert catalog.current_generation() == 2 and len(catalog.origins()) == before


def test_every_start_but_green_s_is_refused_while_a_cutover_is_open(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    with pytest.raises(CutoverInProgress,
                       match=f"zero-downtime cutover {CID} \\(agreed, blue generation 1\\)"):
        check_start(catalog, None, takeover=True)  # takeover does not pass it
    check_start(catalog, None, takeover=True, cutover=CID)  # green's own start
    CutoverStore(catalog).end(CID, "aborted", step="stop", reason="test")
    check_start(catalog, None, takeover=True)



def test_once_green_claimed_the_job_starts_again_by_the_usual_rules(catalog: Catalog) -> None:
    """After green's claim (origin written, then `claimed`) the job is green's: nothing is
    left to race, so the cutover rule no longer refuses starts (a restart of green's task
    without the cutover key, a later deploy) and the usual rules of `check_start` apply,
    whether or not anyone wrote the cutover's `done`."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    adopt(catalog, sink, CID, live_dir=None)
    assert CutoverStore(catalog).read(CID).done is None
    check_start(catalog, None, takeover=False)  # no live run of generation 2: nothing refuses it

_GREEN = """
import sys
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.runtime.cutover import adopt
from airflow_sparkpoint.storage import open_storage
from tests.support.fake_sinks import PositionedSink

adopt(Catalog(open_storage(sys.argv[1]), "orders"), PositionedSink("green", 3), sys.argv[2], live_dir=None)
"""


def test_green_killed_after_its_claim_leaves_blue_s_lineage_to_resume(tmp_path: Path) -> None:
    """Fault point ``cutover_claimed``: green SIGKILLed right after it claimed blue's
    generation + 1. No origin was written, so ``restore=latest`` resumes blue's final
    checkpoint at N; the cutover is not claimed, and calling it off lets blue restart."""
    import signal
    import subprocess
    import sys

    from airflow_sparkpoint.services.cutover import call_off
    from airflow_sparkpoint.storage import open_storage

    root = tmp_path / "root"
    catalog = Catalog(open_storage(str(root)), "orders")
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    uri = _blue_stopped_after(catalog, sink, 3)
    n, marker = 3, tmp_path / "fired"
    env = {**os.environ, "SPARKPOINT_TEST_FAULT": f"cutover_claimed:{n}",
           "SPARKPOINT_TEST_FAULT_ONCE": str(marker), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _GREEN, str(root), CID], env=env, capture_output=True,
                          text=True, check=False,
                          timeout=120, cwd=REPO)
    # it fired
    assert "SPARKPOINT_TEST_FAULT: killing driver at cutover_claimed:3" in proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marker.read_text().strip() == f"cutover_claimed:{n}"
    assert catalog.current_generation() == 2 and not any(o.generation == 2 for o in catalog.origins())
    assert catalog.restart_point().checkpoint.batch_id == 3  # type: ignore[union-attr]
    assert catalog.checkpoint_uri(catalog.restart_point().checkpoint.id) == uri  # type: ignore[union-attr]
    assert CutoverStore(catalog).read(CID).claimed is None
    call_off(catalog, CID, reason="green died", by="test")
    check_start(catalog, None, takeover=False)  # blue's restart may go


def test_the_handover_adapter_serves_green_s_follower(catalog: Catalog) -> None:
    """`CutoverHandover` is `runtime.follow.Handover` over the cutover's records."""
    from airflow_sparkpoint.runtime.cutover import CutoverHandover
    from airflow_sparkpoint.runtime.follow import Handover

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    handover: Handover = CutoverHandover(catalog, sink, CID)
    assert handover.agreed_batch() == 3 and handover.blue_stopped()
    assert handover.adopt("/work/shadow", None) == 2
    # claimed, it can no longer end aborted (green's decision stands): it ends committed
    CutoverStore(catalog).end(CID, "committed", step="first_commit", reason="test")
    with pytest.raises(CutoverError, match="is done"):
        handover.agreed_batch()


def _green_commits(catalog: Catalog, sink: FakeSink, generation: int, batch: int) -> list[int]:
    """Green's run (generation `generation`) stages `batch`, checkpoints it and commits it
    as the coordinator thread does (`Committer.commit_confirmed` after the checkpoint)."""
    from airflow_sparkpoint.checkpoints.generations import Fence
    from airflow_sparkpoint.runtime.committer import Committer

    record = transaction_record(sink, batch, generation, job="orders", created_at=0.0)
    catalog.put_transaction(record)
    committer = Committer(catalog=catalog, sink=sink, fence=Fence(catalog, generation),
                          commit_mode="checkpoint")
    committer.add_pending(record)
    return committer.commit_confirmed(put_checkpoint(catalog, batch_id=batch, generation=generation,
                                                     pending=[record]))


def test_green_s_first_commit_into_blue_s_sink_ends_the_cutover_committed_once(catalog: Catalog) -> None:
    """Nothing but green's run knows when its first batch N+1 landed in blue's sinks: its
    committer writes the cutover's `done: committed` then (so `cutover list` and the
    checkpoints page stop showing it claimed, and the job's next cutover may be planned);
    later commits of the same run, and runs that are no cutover's green, write nothing."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    adoption = adopt(catalog, sink, CID, live_dir=None)
    store = CutoverStore(catalog)
    assert store.read(CID).done is None

    assert _green_commits(catalog, sink, adoption.generation, 4) == [4]
    done = store.read(CID).done
    assert done is not None, "green's first commit must end the cutover"
    assert (done.outcome, done.step, done.generation) == ("committed", "first_commit", adoption.generation)
    assert "batch 4" in done.reason
    first_at = done.at

    assert _green_commits(catalog, sink, adoption.generation, 5) == [5]
    assert store.read(CID).done.at == first_at  # type: ignore[union-attr]  # written once
    store.plan(cutover_plan("1764370000009-0123abcd", blue_generation=adoption.generation,
                            warmup_uri="memory://x/chk-1", warmup_batch=5,
                            green_root="memory://shadow2"))  # the next cutover may open


def test_a_green_killed_before_its_end_record_is_ended_by_the_next_run_s_first_commit(
    catalog: Catalog
) -> None:
    """Green killed between its claim and its `done` (fault point `cutover_first_commit`,
    or before its first commit): its restart is a new generation with no cutover in its
    claim. Its first commit continues green's lineage past N, so it ends the cutover
    ``committed`` (a cutover left ``claimed`` kept the job's next cutover from being
    planned, forever)."""
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    green = adopt(catalog, sink, CID, live_dir=None).generation
    store = CutoverStore(catalog)
    restart = catalog.claim_generation().generation
    assert restart == green + 1
    assert _green_commits(catalog, sink, restart, 4) == [4]
    done = store.read(CID).done
    assert done is not None, "the restart's first commit must end the cutover green left claimed"
    assert (done.outcome, done.step, done.generation) == ("committed", "first_commit", restart)
    assert f"generation {green}" in done.reason and "batch 4" in done.reason
    store.plan(cutover_plan("1764370000009-0123abcd", blue_generation=restart, warmup_uri="memory://x/chk-1",
                            warmup_batch=4, green_root="memory://shadow2"))  # the next cutover may open


def test_a_run_that_is_no_cutover_s_green_writes_no_cutover_record(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    catalog.claim_generation()
    assert _green_commits(catalog, sink, 1, 0) == [0]
    assert CutoverStore(catalog).ids() == []


def test_a_rollback_of_green_after_the_cutover_marks_it_rolled_back(catalog: Catalog) -> None:
    """Rollback after cutover (`services.rollback.abort_generation` of green's
    generation): green's uncommitted output is aborted as for any deploy, and the
    cutover says so (``rolled_back``, in `cutover list` and the checkpoints page); its
    ``done`` stays ``committed`` (what green committed before is visible)."""
    from airflow_sparkpoint.services.rollback import abort_generation

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    green = adopt(catalog, sink, CID, live_dir=None).generation
    _green_commits(catalog, sink, green, 4)
    staged = transaction_record(sink, 5, green, job="orders", created_at=0.0)
    catalog.put_transaction(staged)

    assert abort_generation(catalog, green) == [staged.txn_id]
    state = CutoverStore(catalog).read(CID)
    assert state.step == "rolled_back", state
    assert state.done is not None and state.done.outcome == "committed"
    assert (state.rolled_back is not None
            and (state.rolled_back.generation, state.rolled_back.step) == (green, "rollback"))
    again = CutoverStore(catalog).roll_back(CID, generation=green, reason="twice")
    assert again == state.rolled_back  # written once


def test_a_rollback_of_a_generation_that_is_no_cutover_s_green_writes_no_cutover_record(
    catalog: Catalog
) -> None:
    from airflow_sparkpoint.services.rollback import abort_generation

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    CutoverStore(catalog).end(CID, "aborted", step="stop", reason="test")
    abort_generation(catalog, 1)  # blue: its cutover was called off, never claimed
    assert CutoverStore(catalog).read(CID).rolled_back is None


def test_green_s_claim_carries_its_submit_s_token_and_airflow_try(catalog: Catalog,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit operator finds its run by the token its driver records in its claim
    (`services.runs.find_claim`): green's production generation is claimed by the
    cutover's handover, so that claim must carry green's token (else the task that
    started green never sees the generation it runs as after the takeover)."""
    from airflow_sparkpoint.runtime.config import SUBMITTER_ENV
    from airflow_sparkpoint.runtime.cutover import CutoverHandover
    from airflow_sparkpoint.services.runs import find_claim

    monkeypatch.setenv(SUBMITTER_ENV, "token-of-green")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "deploy")
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", "start_green")
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    generation = CutoverHandover(catalog, sink, CID).adopt("/work/shadow", None)
    claim = find_claim(catalog, "token-of-green")
    assert claim is not None and claim.generation == generation
    assert claim.details["airflow"]["task_id"] == "start_green", claim.details


def test_green_s_shadow_start_passes_beside_a_live_blue_another_task_started(catalog: Catalog) -> None:
    """Green's submit (a shadow of the open cutover) starts while blue runs: it claims
    nothing of blue's job before the cutover's own claim, so the live-run rule does not
    refuse it; the open-cutover rule still refuses a shadow of another cutover."""
    from airflow_sparkpoint.checkpoints.history_records import AirflowTry
    from airflow_sparkpoint.exceptions import JobAlreadyRunning

    catalog.claim_generation()
    write_status(catalog, "running", generation=1, host="elsewhere", pid=1)
    CutoverStore(catalog).plan(cutover_plan(warmup_uri="memory://x/chk-1"))
    green = AirflowTry("deploy", "run", "start_green", 1)
    with pytest.raises(JobAlreadyRunning):
        # a production start of green's own: fences blue
        check_start(catalog, green, takeover=False, cutover=CID)
    check_start(catalog, green, takeover=False, cutover=CID, shadow=True)
    with pytest.raises(CutoverInProgress):
        check_start(catalog, green, takeover=False, cutover=None, shadow=True)


def test_green_s_claim_names_blue_s_final_savepoint_from_the_stop_s_result(catalog: Catalog) -> None:
    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3, complete=False)
    state = CutoverStore(catalog).read(CID)
    assert state.agreed is not None
    channel = ControlChannel(catalog)
    request = channel.read_request(state.agreed.request_id)
    final = catalog.latest()
    assert final is not None
    saved = catalog.create_savepoint(catalog.handle(final), generation=1)
    channel.complete(request, generation=1, batch_id=3, checkpoint=catalog.checkpoint_uri(final.id),
                     savepoint=saved.uri)
    adopt(catalog, sink, CID, live_dir=None)
    claimed = CutoverStore(catalog).read(CID).claimed
    assert claimed is not None and claimed.savepoint == saved.uri


def test_a_rollback_of_green_that_committed_nothing_past_n_returns_to_blue_s_savepoint(
    catalog: Catalog
) -> None:
    """Rollback after the cutover: green (claimed at N, no commit past N) is rolled back;
    the new origin is blue's final savepoint of N (base -1: green's checkpoints,
    its adoption checkpoint included, are superseded), so restore=latest resumes blue's
    state at N. Had green committed past N, it returns to green's own checkpoint (the
    sink would be ahead of the savepoint)."""
    from airflow_sparkpoint.services.rollback import abort_generation

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3, complete=False)
    state = CutoverStore(catalog).read(CID)
    assert state.agreed is not None
    channel = ControlChannel(catalog)
    final = catalog.latest()
    assert final is not None
    pending = transaction_record(sink, 3, 1, job="orders", created_at=0.0)
    saved = catalog.create_savepoint(catalog.handle(final.with_(transactions=(pending,))), generation=1)
    channel.complete(channel.read_request(state.agreed.request_id), generation=1, batch_id=3,
                     checkpoint=catalog.checkpoint_uri(final.id), savepoint=saved.uri)
    green = adopt(catalog, sink, CID, live_dir=None).generation
    put_checkpoint(catalog, batch_id=3, generation=green)  # green's adoption checkpoint at N
    staged = transaction_record(sink, 4, green, job="orders", created_at=0.0)
    catalog.put_transaction(staged)  # green staged N+1, never committed

    assert abort_generation(catalog, green) == [staged.txn_id]
    origin = catalog.origins()[-1]
    assert (origin.generation, origin.kind, origin.uri, origin.batch_id, origin.base_id) == (
        green + 1, "savepoint", saved.uri, 3, -1)
    point = catalog.restart_point()
    assert point.checkpoint is None and point.uri == saved.uri, point
    assert CutoverStore(catalog).read(CID).to_json()["rolled_back_to"] == saved.uri


def test_a_green_started_again_after_its_claim_restarts_the_job_instead_of_warming_up(
    catalog: Catalog
) -> None:
    """Green's task retried after green claimed the job (killed at or after
    `cutover_first_commit`), with the same settings (an Airflow retry: the cutover's
    shadow settings): the job is green's, so the retry is a restart of it
    (``restore=latest``), not a new warm-up that its claim of blue + 1 would refuse. Not
    after a call-off, a rollback of green, or before the claim."""
    from airflow_sparkpoint.runtime.cutover import taken_over

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    store = CutoverStore(catalog)
    assert taken_over(catalog, CID) is None  # blue stopped, green has not claimed: a warm-up's retry
    green = adopt(catalog, sink, CID, live_dir=None).generation
    assert taken_over(catalog, CID) == green  # claimed, no end yet
    _green_commits(catalog, sink, green, 4)
    assert store.read(CID).done is not None
    assert taken_over(catalog, CID) == green  # ended committed: still green's job
    store.roll_back(CID, generation=green, reason="test", by="test")
    assert taken_over(catalog, CID) is None  # rolled back: green's task must not run the job again


def test_a_cutover_called_off_is_no_takeover(catalog: Catalog) -> None:
    from airflow_sparkpoint.runtime.cutover import taken_over
    from airflow_sparkpoint.services.cutover import call_off

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    _blue_stopped_after(catalog, sink, 3)
    call_off(catalog, CID, reason="test", by="test")
    assert taken_over(catalog, CID) is None
