"""`transfer_all`: the bounded pool behind parallel uploads, downloads and savepoint
copies keeps what the sequential loops guaranteed (order, first failure raised with
nothing left running, checks in the caller's thread, the halfway fault)."""

from __future__ import annotations

import threading

import pytest

from airflow_sparkpoint.checkpoints import transfer
from airflow_sparkpoint.checkpoints.transfer import transfer_all


class Tracker:
    """Counts calls running at once; the first `meet` calls wait for each other at a
    barrier, which breaks (and fails the test) if they never run at the same time."""

    def __init__(self, meet: int = 0) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.started: list[int] = []
        self.barrier = threading.Barrier(meet, timeout=30) if meet > 1 else None

    def __call__(self, item: int) -> int:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started.append(item)
            first = len(self.started) <= (self.barrier.parties if self.barrier else 0)
        try:
            if first and self.barrier is not None:
                self.barrier.wait()
            return item * item
        finally:
            with self.lock:
                self.running -= 1


def test_results_in_order_with_calls_running_at_once_and_bounded():
    tracker = Tracker(meet=3)
    assert transfer_all(tracker, list(range(40)), threads=3) == [i * i for i in range(40)]
    assert tracker.peak == 3  # the barrier proved 3 at once; never more than `threads`
    assert sorted(tracker.started) == list(range(40))


def test_empty_and_single_item():
    assert transfer_all(Tracker(), []) == []
    assert transfer_all(Tracker(), [7]) == [49]


def test_one_failure_is_raised_nothing_new_starts_and_nothing_is_left_running():
    release = threading.Event()
    lock = threading.Lock()
    state = {"running": 0, "started": 0}
    done: list[int] = []

    def fn(item: int) -> int:
        with lock:
            state["running"] += 1
            state["started"] += 1
        try:
            if item == 3:
                raise OSError("upload of item 3 failed")
            release.wait(0.05)
            return item
        finally:
            with lock:
                state["running"] -= 1

    with pytest.raises(OSError, match="item 3"):
        transfer_all(fn, list(range(100)), threads=4, on_done=lambda d, t: done.append(d))
    assert state["running"] == 0  # the ones under way were waited for
    assert state["started"] < 100  # nothing new started after the failure
    assert len(done) <= 3 + 4  # on_done only for items finished before the failure was seen


def test_check_runs_before_each_start_and_stops_the_run():
    calls: list[int] = []

    def check() -> None:
        if len(calls) >= 5:
            raise TimeoutError("deadline")

    def fn(item: int) -> int:
        calls.append(item)
        return item

    with pytest.raises(TimeoutError):
        transfer_all(fn, list(range(50)), threads=1, check=check)
    assert calls == [0, 1, 2, 3, 4]


def test_on_done_counts_every_item_once():
    seen: list[tuple[int, int]] = []
    transfer_all(Tracker(), list(range(9)), threads=4, on_done=lambda d, t: seen.append((d, t)))
    assert seen == [(d, 9) for d in range(1, 10)]


def test_held_at_half_the_second_half_starts_only_after_on_half():
    tracker = Tracker()
    fired: list[tuple[int, list[int]]] = []

    def on_half() -> None:
        fired.append((tracker.running, sorted(tracker.started)))

    assert transfer_all(tracker, list(range(10)), threads=8, on_half=on_half, hold_at_half=True) == [
        i * i for i in range(10)]
    assert fired == [(0, [0, 1, 2, 3, 4])]  # exactly half done, nothing of the rest started


def test_on_half_runs_once_without_holding(monkeypatch):
    fired: list[int] = []
    transfer_all(Tracker(), list(range(7)), threads=2, on_half=lambda: fired.append(1))
    transfer_all(Tracker(), [1], on_half=lambda: fired.append(2), hold_at_half=True)
    transfer_all(Tracker(), [], on_half=lambda: fired.append(3), hold_at_half=True)
    assert fired == [1, 2]  # like the sequential loop: no files, no halfway point


def test_a_kill_at_half_is_the_coordinators_copy_fault(monkeypatch):
    """The coordinator wires the ``copy`` fault point through `on_half`."""
    import inspect

    from airflow_sparkpoint.runtime import checkpointer

    source = inspect.getsource(checkpointer.Checkpointer._checkpoint)
    assert 'on_half=lambda: faults.maybe_kill("copy", batch_id), hold_at_half=faults.armed("copy")' in source


def test_default_is_a_bounded_internal_constant():
    assert 1 < transfer.THREADS <= 16
