"""The first batch of a new Delta table, committed by two committers of one transaction
(issue #27, item 1): a stalled committer (the first try, a zombie) and the retry's
recovery, or two concurrent aborts that both help a decided commit land. Neither had a
table to read before its write, so nothing but the create itself can stop the second
one from writing the batch again: it must be a create that fails when the table exists,
followed by the landed check.

Two sink instances in two threads; the sinks' pause points (`faults.pause`) are routed
to per-thread gates, so the interleaving is exact and each test proves it reached it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import faults
from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.sinks import DeltaSink
from tests.support.delta_staging import JOB, staged, table_rows


class Gates:
    """Pause points per (thread name, point): the thread blocks there until released."""

    def __init__(self) -> None:
        self._gates: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}

    def arm(self, thread: str, point: str) -> None:
        self._gates[(thread, point)] = (threading.Event(), threading.Event())

    def pause(self, point: str, batch_id: int | None = None, **details: object) -> bool:
        gate = self._gates.get((threading.current_thread().name, point))
        if gate is None:
            return False
        gate[0].set()
        gate[1].wait()
        return True

    def reached(self, thread: threading.Thread, point: str) -> None:
        """Wait until `thread` is held at `point` (fails if it ended first)."""
        reached = self._gates[(thread.name, point)][0]
        while not reached.wait(0.05):
            assert thread.is_alive(), f"{thread.name} ended before pause point {point}"

    def release(self, thread: str, point: str) -> None:
        self._gates[(thread, point)][1].set()


@pytest.fixture()
def gates(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gates]:
    gates = Gates()
    monkeypatch.setattr(faults, "pause", gates.pause)
    yield gates
    for _reached, release in gates._gates.values():
        release.set()


@pytest.fixture(params=["append", "merge"])
def new_table(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], DeltaSink]:
    """A factory of sink instances on one table that does not exist yet."""
    def make() -> DeltaSink:
        if request.param == "merge":
            return DeltaSink(str(tmp_path / "t"), mode="merge", keys=["user"])
        return DeltaSink(str(tmp_path / "t"))
    return make


def run(name: str, outcomes: dict[str, Any], fn: Callable[[], Any]) -> threading.Thread:
    """`fn` in a thread named `name`; its return value or exception lands in `outcomes`."""
    def target() -> None:
        try:
            outcomes[name] = fn()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcomes[name] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def commits_of_batch(sink: DeltaSink, batch: int) -> list[int]:
    from deltalake import DeltaTable

    return [int(e["version"]) for e in DeltaTable(sink.path).history()
            if e.get("sparkpoint.job") == JOB and e.get("sparkpoint.batch") == str(batch)]


def test_a_stalled_committer_of_batch_0_does_not_write_it_again_into_the_table_its_retry_created(
    new_table: Callable[[], DeltaSink], gates: Gates
) -> None:
    """The first try decided to promote batch 0 and stalled (``claimed``); the retry's
    recovery committed the same transaction, creating the table, and is held before it
    removes the staged files (``landed``); then the first try wakes."""
    zombie, retry = new_table(), new_table()
    record = staged(zombie, 0, 1, [("a", 1), ("b", 2)])
    outcomes: dict[str, Any] = {}
    gates.arm("zombie", "claimed")
    gates.arm("retry", "landed")

    first = run("zombie", outcomes, lambda: zombie.commit(record))
    gates.reached(first, "claimed")  # decided promote; no table existed when it looked
    second = run("retry", outcomes, lambda: retry.commit(record))
    gates.reached(second, "landed")  # the table exists now, holding batch 0
    gates.release("zombie", "claimed")
    first.join()
    gates.release("retry", "landed")
    second.join()

    assert not isinstance(outcomes["retry"], Exception), outcomes["retry"]
    assert not isinstance(outcomes["zombie"], Exception), outcomes["zombie"]
    assert outcomes["retry"].status == "committed"
    assert table_rows(retry) == [("a", 1), ("b", 2)]
    assert commits_of_batch(retry, 0) == [0]
    assert retry.committed_position(JOB) == 0 and retry.is_committed(record)


def test_two_aborts_helping_a_decided_first_batch_land_write_it_once(
    new_table: Callable[[], DeltaSink], gates: Gates
) -> None:
    """The committer decided to promote batch 0 and died; two aborters (e.g. a recovery
    and the commit step) both find the decision, no table, and finish the commit."""
    one, two = new_table(), new_table()
    record = staged(one, 0, 1, [("a", 1), ("b", 2)])
    one._decide(record, "promote")
    outcomes: dict[str, Any] = {}
    gates.arm("one", "claimed")
    gates.arm("two", "claimed")
    gates.arm("two", "landed")

    first = run("one", outcomes, lambda: one.abort(record))
    gates.reached(first, "claimed")  # found the decision and no table; about to commit it
    second = run("two", outcomes, lambda: two.abort(record))
    gates.reached(second, "claimed")  # the same
    gates.release("two", "claimed")
    gates.reached(second, "landed")  # it created the table with batch 0
    gates.release("one", "claimed")
    first.join()
    gates.release("two", "landed")
    second.join()

    for name in ("one", "two"):
        assert isinstance(outcomes[name], SinkError) and "has committed" in str(outcomes[name]), \
            outcomes[name]
    assert table_rows(one) == [("a", 1), ("b", 2)]
    assert commits_of_batch(one, 0) == [0]
