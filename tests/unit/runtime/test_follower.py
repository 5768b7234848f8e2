"""`runtime.follow.Follower` without Spark: the follower's decisions (which batch next,
the chain, divergence, the end, a cutover's agreed batch) over real catalogs and a real
live location; Spark's run of one batch is replaced by writing its commit file (what
`replay.run_batch` checks Spark did)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.follow_record import FollowProgress, read_follow
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.runtime import follow, replay
from airflow_sparkpoint.runtime.config import Shadow
from airflow_sparkpoint.sinks.shadow import ShadowSink
from airflow_sparkpoint.storage import LocalStorage
from tests.support.fake_sinks import ReplayRecordSink
from tests.support.records import write_status
from tests.support.replay_lives import live, pending


class FakeRun:
    """The shadow's run as the follower sees it (`follow.FollowedRun`), restored at `restart`."""

    def __init__(self, tmp_path: Path, blue_live: Path, restart: int) -> None:
        self.spark: Any = None
        self.df: Any = None
        self.output_mode = "update"
        self.cfg: Any = SimpleNamespace(job="orders-shadow")
        self.catalog = Catalog(LocalStorage(str(tmp_path / "shadow")), "orders-shadow")
        self.live = str(tmp_path / "green-live")
        (tmp_path / "green-live" / "offsets").mkdir(parents=True)
        (tmp_path / "green-live" / "commits").mkdir()
        for name in ("offsets", "commits"):
            (tmp_path / "green-live" / name / str(restart)).write_text(
                (blue_live / "offsets" / str(restart)).read_text() if name == "offsets" else "v1\n{}")
        self.plan: Any = SimpleNamespace(batch_id=restart)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.query: Any = None
        self.fence: Any = SimpleNamespace(check=lambda: None)
        self.generation = 1
        self.ran: list[int] = []

    def stage_batch(self, df: Any, batch_id: int) -> None:
        raise AssertionError("not called: Spark is replaced")

    def stop_query(self) -> None:
        pass


@pytest.fixture
def spark_replaced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """`replay.run_batch` writes the batch's commit file (Spark committing it)."""
    runs: list[tuple[str, int]] = []

    def run_batch(spark: Any, df: Any, mode: str, live_root: str, batch: int, **_: Any) -> None:
        Path(live_root, "commits", str(batch)).write_text("v1\n{}")
        runs.append((live_root, batch))

    monkeypatch.setattr(replay, "run_batch", run_batch)
    return runs


def setup(tmp_path: Path, batches: int, restart: int, committed: range, *, until: int | None = None,
          handover: Any = None) -> tuple[FakeRun, follow.Follower, ReplayRecordSink, Catalog, Path]:
    blue_live = live(tmp_path, batches)
    sink = ReplayRecordSink({b: replay.capture(str(blue_live), b) for b in committed})
    blue_catalog = Catalog(LocalStorage(str(tmp_path / "blue")), "orders")
    run = FakeRun(tmp_path, blue_live, restart)
    start: Any = SimpleNamespace(uri="file:///blue/orders/chk-1", metadata=SimpleNamespace(batch_id=restart))
    shadowing = follow.Shadowing(
        config=None, sink=ShadowSink(), blue=follow.BlueJob(blue_catalog, sink), start=start,  # type: ignore[arg-type]
        shadow=Shadow(mode="discard", dir=str(tmp_path / "shadow"), job="orders-shadow", until_batch=until,
                      poll_interval_s=0.01),
        user_sink=sink, handover=handover)  # type: ignore[arg-type]
    return run, follow.Follower(run, shadowing, stage=run.stage_batch), sink, blue_catalog, blue_live


def test_the_follower_replays_blue_s_batches_in_order_and_ends_with_blue(tmp_path, spark_replaced):
    run, follower, _sink, _cat, blue_live = setup(tmp_path, 6, 1, range(6))
    follower.follow()
    assert [b for _live, b in spark_replaced] == [2, 3, 4, 5]
    for b in range(2, 6):  # blue's offset log entries, byte for byte
        assert Path(run.live, "offsets", str(b)).read_text() == (blue_live / "offsets" / str(b)).read_text()
    progress = read_follow(run.catalog.store)
    assert progress is not None and (progress.state, progress.last_replayed, progress.started_batch) == (
        "ended", 5, 1)


def test_a_record_that_does_not_continue_the_chain_is_divergence(tmp_path, spark_replaced):
    _run, follower, sink, _cat, _blue_live = setup(tmp_path, 6, 1, range(6))
    sink.records[3] = sink.records[4]  # another batch's record: wrong batch id
    with pytest.raises(SparkpointError, match=r"names batch 4, not 3"):
        follower.follow()
    other = live(tmp_path / "other", 6)
    (other / "offsets" / "2").write_text((other / "offsets" / "2").read_text() + "\n")  # another plan of 2
    sink.records[3] = replay.capture(str(other), 3)
    run2, follower2, _s, _c, _l = setup(tmp_path / "again", 6, 1, range(6))
    follower2.blue.sink.records[3] = sink.records[3]  # type: ignore[attr-defined]
    with pytest.raises(SparkpointError, match=r"blue's batch 3 does not continue .* diverged"):
        follower2.follow()
    assert [b for _live, b in spark_replaced if _live == run2.live] == [2]
    progress = read_follow(run2.catalog.store)
    assert progress is not None and progress.state == "failed" and "diverged" in (progress.error or "")


def test_a_batch_replayed_from_a_pending_record_must_be_what_blue_committed(tmp_path, spark_replaced):
    _run, follower, sink, blue_catalog, blue_live = setup(tmp_path, 6, 1, range(3))
    pending(blue_catalog, 3, 1, replay.capture(str(blue_live), 3))
    other = live(tmp_path / "other", 6)
    (other / "offsets" / "3").write_text((other / "offsets" / "3").read_text() + "\n")

    original = replay.run_batch

    def commit_other_offsets(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        if args[4] == 3:  # blue re-planned batch 3 and committed other offsets
            sink.records[3] = replay.capture(str(other), 3)

    replay.run_batch = commit_other_offsets  # type: ignore[assignment]
    with pytest.raises(SparkpointError, match=r"blue committed batch 3 with other offsets .* diverged"):
        follower.follow()


def test_a_batch_replayed_from_a_pending_record_that_blue_never_commits_fails_at_the_end(
        tmp_path, spark_replaced):
    _run, follower, _sink, blue_catalog, blue_live = setup(tmp_path, 6, 1, range(3))
    pending(blue_catalog, 3, 1, replay.capture(str(blue_live), 3))
    with pytest.raises(SparkpointError, match=r"blue ended without committing it"):
        follower.follow()


class FakeHandover:
    def __init__(self, agreed: int | None, stopped_after: int) -> None:
        self.agreed = agreed
        self.stopped_after = stopped_after  # blue_stopped() calls before it says True
        self.reports: list[tuple[int, int]] = []

    def report(self, progress: FollowProgress, shadow_generation: int) -> None:
        self.reports.append((progress.last_replayed, shadow_generation))

    def agreed_batch(self) -> int | None:
        return self.agreed

    def blue_stopped(self) -> bool:
        self.stopped_after -= 1
        return self.stopped_after < 0


def test_with_a_cutover_the_shadow_stops_at_the_agreed_batch_once_blue_stopped_there(
    tmp_path, spark_replaced
):
    handover = FakeHandover(agreed=3, stopped_after=2)
    run, follower, _sink, _cat, _live = setup(tmp_path, 6, 1, range(6), handover=handover)
    follower.follow()
    assert [b for _live, b in spark_replaced] == [2, 3]  # not 4, 5: they are green's to run for real
    assert handover.stopped_after < 0 and (3, 1) in handover.reports
    progress = read_follow(run.catalog.store)
    assert progress is not None and (progress.state, progress.last_replayed) == ("ended", 3)


def test_with_a_cutover_a_blue_that_ended_before_the_agreed_batch_is_refused(tmp_path, spark_replaced):
    _run, follower, _sink, _cat, _live = setup(tmp_path, 6, 1, range(4), handover=FakeHandover(5, 0))
    with pytest.raises(SparkpointError, match=r"replayed through batch 3, not the agreed batch 5"):
        follower.follow()


def test_at_the_until_batch_the_shadow_waits_for_a_running_blue_to_commit_what_it_replayed_pending(
        tmp_path, spark_replaced):
    import time

    run, follower, sink, blue_catalog, blue_live = setup(tmp_path, 6, 1, range(3), until=3)
    write_status(blue_catalog, "running", generation=1, last_batch=2)
    pending(blue_catalog, 3, 1, replay.capture(str(blue_live), 3))

    def blue_commits_3_later() -> None:
        time.sleep(0.5)
        sink.records[3] = replay.capture(str(blue_live), 3)

    committer = threading.Thread(target=blue_commits_3_later)
    committer.start()
    follower.follow()
    committer.join()
    progress = read_follow(run.catalog.store)
    assert progress is not None and (progress.state, progress.last_replayed, progress.verified_through) == (
        "ended", 3, 3)
