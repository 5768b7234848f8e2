"""``checkpoint.interval=0`` while checkpoints are slower than batches: the backlog of due
checkpoints is bounded (`checkpointer.MAX_CHECKPOINT_BACKLOG`), control requests are served
between the checkpoints of a backlog, and the batches a restart replayed get no checkpoint
each. The real coordinator thread loop on the stand-in run of tests/support/coordinator_runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control_records import ControlRequest
from airflow_sparkpoint.runtime.checkpointer import MAX_CHECKPOINT_BACKLOG
from tests.support.checkpointers import catalog
from tests.support.coordinator_runs import coordinator_run, stage_batches
from tests.support.fake_sinks import RecordingSink
from tests.support.live_dirs import write_live

__all__ = ["catalog"]  # the fixture


def _progress(batches: range) -> list[tuple[str, Any]]:
    return [("progress", b) for b in batches]


def test_every_batch_is_checkpointed_while_the_backlog_is_within_the_bound(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    batches = range(MAX_CHECKPOINT_BACKLOG)
    coordinator = coordinator_run(catalog, live, sink, [*_progress(batches), ("final", None)])
    run = coordinator.state
    stage_batches(catalog, run, live, batches)

    coordinator.run()

    assert run.error is None, run.error
    assert sorted(m.batch_id for m in catalog.checkpoints()) == list(batches)
    assert sorted(sink.committed) == list(batches)


def test_beyond_the_bound_only_the_newest_batch_is_checkpointed_and_the_skipped_ones_are_named(
        catalog, tmp_path, caplog):
    live, sink = tmp_path / "live", RecordingSink()
    batches = range(MAX_CHECKPOINT_BACKLOG + 1)
    coordinator = coordinator_run(catalog, live, sink, [*_progress(batches), ("final", None)])
    run = coordinator.state
    stage_batches(catalog, run, live, batches)

    with caplog.at_level(logging.WARNING, logger="airflow_sparkpoint.runtime.checkpointer"):
        coordinator.run()

    assert run.error is None, run.error
    newest = batches[-1]
    assert [m.batch_id for m in catalog.checkpoints()] == [newest], "the backlog must not be worked through"
    assert sorted(sink.committed) == list(batches), "every batch is still committed, by the newest checkpoint"
    assert f"batches 0..{newest - 1}" in caplog.text, caplog.text


class _Control:
    """One control request, pending from the `after`-th look on; records the checkpoints
    that existed when the run took it, and ends the query (stop: when taken; savepoint: when
    completed)."""

    def __init__(self, catalog: Catalog, run: Any, kind: str, after: int) -> None:
        self.catalog, self.run, self.after, self.looks = catalog, run, after, 0
        now = time.time()
        self.request = ControlRequest(id="r1", kind=kind, job="job", created_at=now, deadline=now + 3600)
        self.checkpoints_when_taken: list[int] | None = None
        self.outcome: dict[str, Any] | None = None

    def withdraw_superseded(self, generation: int) -> list[str]:
        return []

    def cleanup(self, older_than_s: float = 86400, *, limit: int | None = None) -> int:
        return 0

    def pending(self, generation: int) -> list[ControlRequest]:
        self.looks += 1
        return [self.request] if self.looks >= self.after and self.checkpoints_when_taken is None else []

    def acknowledge(self, request: ControlRequest, generation: int) -> None:
        self.checkpoints_when_taken = sorted(m.batch_id for m in self.catalog.checkpoints())
        if request.kind == "stop":
            self.run.events.put(("final", None))  # the stopped query ends

    def complete(self, request: ControlRequest, *, generation: int, **outcome: Any) -> None:
        self.outcome = outcome
        if request.kind == "savepoint":
            self.run.events.put(("final", None))  # the query ends after it

    def fail(self, request: ControlRequest, *, generation: int, error: str) -> None:
        self.outcome = {"error": error}


def test_a_savepoint_request_waits_for_one_checkpoint_of_a_backlog_not_all_of_them(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    batches = range(3)
    # all queued: one round of 3 due checkpoints
    coordinator = coordinator_run(catalog, live, sink, _progress(batches))
    run = coordinator.state
    stage_batches(catalog, run, live, batches)
    control = run.control = _Control(catalog, run, "savepoint", after=2)  # the first look is before the round

    coordinator.run()

    assert run.error is None, run.error
    assert control.looks >= 2, "the request was never looked for"
    assert control.checkpoints_when_taken == [0], "served only after the whole backlog"
    assert control.outcome is not None and control.outcome["batch_id"] == 2, control.outcome
    # The savepoint took the newest batch: the older batch 1 does not come after it.
    assert sorted(m.batch_id for m in catalog.checkpoints()) == [0, 2]
    assert sorted(sink.committed) == list(batches)


def test_a_stop_request_ends_the_backlog_after_one_checkpoint(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    batches = range(3)
    coordinator = coordinator_run(catalog, live, sink, _progress(batches))
    run = coordinator.state
    stage_batches(catalog, run, live, batches)
    control = run.control = _Control(catalog, run, "stop", after=2)

    coordinator.run()

    assert run.error is None, run.error
    assert control.checkpoints_when_taken == [0], "served only after the whole backlog"
    assert run.stopping.is_set()
    assert control.outcome is not None and control.outcome["batch_id"] == 2, control.outcome
    assert sorted(sink.committed) == list(batches)


def test_the_batches_a_restart_replayed_get_no_checkpoint_each(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    coordinator = coordinator_run(catalog, live, sink, [("progress", 3), ("final", None)])
    run = coordinator.state
    for batch in range(3):  # replayed (runtime.replay): in commits/, the sink holds them, no transaction
        write_live(live, batch)
    run.checkpointer.replayed(2)
    stage_batches(catalog, run, live, range(3, 4))

    coordinator.run()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [3], "a replayed batch got a checkpoint of its own"
    assert sorted(sink.committed) == [3]
