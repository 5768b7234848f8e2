"""A run deletes the control requests that finished over a day ago (issue 32: a job that
runs for weeks lists ``control/`` at every poll; a savepoint every 10 minutes from the
operator, which never cleans up, left 3 objects each, ≈ 13,000 after a month). Once an
hour, in bounded steps while a backlog lasts, and never failing the run.

The real `RunCoordinator.tidy_control` (the coordinator thread calls it at each control poll) on a
stand-in run: a real control channel over an in-memory store, the clocks under the test's
control.
"""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.exceptions import StorageError
from airflow_sparkpoint.runtime import run_coordination
from airflow_sparkpoint.storage.memory import MemoryStorage

DAY = 86400.0


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 1000.0


@pytest.fixture()
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    clocks = Clocks()
    monkeypatch.setattr(run_coordination.time, "monotonic", lambda: clocks.mono)
    return clocks


def finished(channel: ControlChannel, count: int, generation: int = 1) -> list[str]:
    ids = []
    for _ in range(count):
        request = channel.submit("savepoint", generation=generation)
        channel.acknowledge(request, generation)
        channel.complete(request, generation=generation, savepoint="savepoints/savepoint-3-ab12cd34")
        ids.append(request.id)
    return ids


def stand_in_run(catalog: Catalog, clocks: Clocks, generation: int = 2) -> Any:
    control = ControlChannel(catalog)
    control.clock = lambda: clocks.wall
    run = SimpleNamespace(cfg=SimpleNamespace(job=catalog.job), generation=generation, error=None,
                          # only what serving control requests reads
                          stopping=threading.Event(), control=control)
    return run_coordination.RunCoordinator(run)  # type: ignore[arg-type]


def test_a_run_removes_requests_finished_over_a_day_ago_hourly_and_a_backlog_in_steps(clocks: Clocks) -> None:
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    requester = ControlChannel(catalog)
    requester.clock = lambda: clocks.wall
    batch = run_coordination.CONTROL_CLEANUP_BATCH
    finished(requester, batch + 50)
    clocks.wall += 2 * DAY
    recent = finished(requester, 3)
    run = stand_in_run(catalog, clocks)

    run.tidy_control()
    assert len(requester.request_ids()) == 50 + 3, "a full batch goes at the first poll"
    clocks.mono += 2
    run.tidy_control()
    assert len(requester.request_ids()) == 50 + 3, "the next batch of a backlog waits its pause ..."
    clocks.mono += run_coordination.CONTROL_CLEANUP_BACKLOG_S
    run.tidy_control()
    assert sorted(requester.request_ids()) == sorted(recent), "... then takes the rest"

    clocks.wall += DAY + 601  # the recent ones (and their deadlines) are now over a day old too ...
    clocks.mono += run_coordination.CONTROL_CLEANUP_BACKLOG_S
    run.tidy_control()
    assert sorted(requester.request_ids()) == sorted(recent), \
        "... but the next pass is an hour after the last"
    clocks.mono += run_coordination.CONTROL_CLEANUP_EVERY_S
    run.tidy_control()
    assert requester.request_ids() == []


@pytest.mark.parametrize("error", [StorageError("the store is unreachable"),
                                   OverflowError("int too large to convert to float")])
def test_an_error_while_tidying_is_logged_and_the_run_goes_on(
    clocks: Clocks, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    """A store error, or a result file no parser expected (an ``updated_at`` of 400 digits):
    housekeeping never fails the run."""
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    run = stand_in_run(catalog, clocks)
    calls = []

    def failing_cleanup(**kw: Any) -> int:
        calls.append(kw)
        raise error

    run.state.control.cleanup = failing_cleanup
    run.tidy_control()
    clocks.mono += run_coordination.CONTROL_CLEANUP_BACKLOG_S
    run.tidy_control()
    assert len(calls) == 1, "tried again an hour later, not at every poll"
    assert "could not remove finished control requests" in caplog.text and str(error) in caplog.text
    clocks.mono += run_coordination.CONTROL_CLEANUP_EVERY_S
    run.tidy_control()
    assert len(calls) == 2


def test_a_run_gives_its_free_heap_back_to_the_system_once_an_hour(clocks, monkeypatch):
    from airflow_sparkpoint.runtime import heap

    trims: list[float] = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(clocks.mono) or True)
    run = stand_in_run(Catalog(MemoryStorage(uuid.uuid4().hex), "job"), clocks)
    run.trim_heap()
    clocks.mono += heap.TRIM_EVERY_S - 1
    run.trim_heap()
    assert trims == [1000.0]  # once at the first poll, not again within the hour
    clocks.mono += 1
    run.trim_heap()
    assert trims == [1000.0, 1000.0 + heap.TRIM_EVERY_S]


def test_the_heap_trim_runs_where_the_c_library_is_glibc_and_never_raises():
    import platform

    from airflow_sparkpoint.runtime import heap

    glibc = platform.libc_ver()[0] == "glibc"
    assert heap.trim() is glibc
    assert heap.trim() is glibc  # twice: nothing left to give back is no error
