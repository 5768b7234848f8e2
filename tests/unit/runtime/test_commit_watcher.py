"""The run's commit watcher: each batch Spark commits (``commits/<N>``) reaches the
coordinator once, in order, from the batch after the restart point; no Spark."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from airflow_sparkpoint.runtime import commit_watch, job


def _commit(live: Path, batch: int) -> None:
    (live / "commits").mkdir(parents=True, exist_ok=True)
    (live / "commits" / f".{batch}.tmp").write_text("v1")  # Spark's temp name first
    (live / "commits" / f".{batch}.tmp").rename(live / "commits" / str(batch))


def _watch(live: Path, seen: int | None):
    run = SimpleNamespace(live=str(live), events=queue.Queue(), _watch_stop=threading.Event())
    thread = threading.Thread(target=job.watch_commits, args=(run.live, run.events, run._watch_stop, seen),
                              daemon=True)
    thread.start()
    return run, thread


def _events(run, count: int, timeout: float = 5.0) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        try:
            got.append(run.events.get(timeout=0.1))
        except queue.Empty:
            pass
    return got


def test_each_commit_after_the_restart_point_once_in_order(tmp_path):
    for batch in range(3):  # restored: batches 0-2 were committed before this run
        _commit(tmp_path, batch)
    run, thread = _watch(tmp_path, seen=2)
    for batch in (3, 4, 5):
        _commit(tmp_path, batch)
    assert _events(run, 3) == [("progress", 3), ("progress", 4), ("progress", 5)]
    time.sleep(0.3)
    assert run.events.empty()  # nothing twice, nothing from before the restart point
    run._watch_stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_fresh_query_starts_at_batch_0(tmp_path):
    run, thread = _watch(tmp_path, seen=None)
    _commit(tmp_path, 0)
    _commit(tmp_path, 1)
    assert _events(run, 2) == [("progress", 0), ("progress", 1)]
    run._watch_stop.set()
    thread.join(timeout=5)


def test_a_gap_in_the_commit_log_is_found_by_the_listing(tmp_path, monkeypatch):
    """Spark never skips a batch id; if a commit file were missing, the periodic listing
    still delivers the commits after it (and only batches that have one)."""
    monkeypatch.setattr(commit_watch, "COMMIT_LISTING_INTERVAL_S", 0.2)
    run, thread = _watch(tmp_path, seen=None)
    _commit(tmp_path, 1)  # no commits/0
    assert _events(run, 1) == [("progress", 1)]
    _commit(tmp_path, 2)
    assert _events(run, 1) == [("progress", 2)]
    assert run.events.empty()
    run._watch_stop.set()
    thread.join(timeout=5)
