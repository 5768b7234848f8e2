"""``checkpoint.interval=0`` means a retained checkpoint of every batch (docs/reference/config.md),
also when the coordinator thread falls behind Spark: progress events queued while a
checkpoint ran, or not yet seen by the commit watcher when the query ended, must not make it skip
the batches between (the flaky ``_first_run`` of tests/races/test_lineages.py retained
``[7, 5, 4]``: batch 6's progress event was queued behind 7's, or arrived after the end).

The real coordinator thread loop (`_Run._coordinate`) on a stand-in run: a hand-made live
location, an in-memory catalog and a recording sink; Spark is replaced by the events queue.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.job import _Run
from tests.support.checkpointers import catalog, checkpointer
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live

__all__ = ["catalog"]  # the fixture


class _Control:
    def withdraw_superseded(self, generation: int) -> list[str]:
        return []

    def pending(self, generation: int) -> list[Any]:
        return []

    def cleanup(self, older_than_s: float = 86400, *, limit: int | None = None) -> int:
        return 0


def _run(catalog: Catalog, live: Path, sink: RecordingSink, events: list[tuple[str, Any]], **kw: Any) -> _Run:
    """A run whose query already processed batches (`write_live`, staged `record`s) and
    whose coordinator thread has not looked at `events` yet."""
    generation = catalog.claim_generation().generation
    run = object.__new__(_Run)  # the coordinator thread's attributes only, no Spark
    run.cfg = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/tmp/unused", "spark.sparkpoint.job": "job",
                                          "spark.sparkpoint.stateStore": "hdfs"})
    run.generation = generation
    run.checkpointer = checkpointer(catalog, live, sink, generation, num_retained=10, **kw)
    run.committer = run.checkpointer.transactions
    run.live = str(live)
    run.control = _Control()  # type: ignore[assignment]
    run.events = queue.Queue()
    for event in events:
        run.events.put(event)
    run.stopping = threading.Event()
    run.error = None
    run.query = None
    run.query_failed = False
    run.stop_request = None
    run.batches_staged, run.first_batch = 0, None
    run._control_tidy_at = run._heap_trim_at = 0.0
    return run


def _staged(catalog: Catalog, run: _Run, live: Path, batches: range) -> None:
    for batch in batches:
        write_live(live, batch)
        catalog.put_transaction(recording_record(batch, run.generation))
        run.committer.add_pending(recording_record(batch, run.generation))


def test_progress_events_queued_behind_each_other_still_checkpoint_every_batch(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    run = _run(catalog, live, sink, [("progress", 0), ("progress", 1), ("progress", 2), ("final", None)])
    _staged(catalog, run, live, range(3))

    run._coordinate()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [2, 1, 0], "a batch was left without its checkpoint"
    assert sorted(sink.committed) == [0, 1, 2]


def test_batches_whose_progress_events_arrive_after_the_end_are_checkpointed_at_the_end(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    run = _run(catalog, live, sink, [("progress", 0), ("final", None)])  # 1 and 2: not yet seen by the watcher
    _staged(catalog, run, live, range(3))

    run._coordinate()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [2, 1, 0], "a batch was left without its checkpoint"
    assert sorted(sink.committed) == [0, 1, 2]


def test_with_an_interval_only_the_newest_batch_is_checkpointed_when_it_is_due(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    run = _run(catalog, live, sink, [("progress", 0), ("progress", 1), ("progress", 2), ("final", None)],
               interval_s=3600)
    _staged(catalog, run, live, range(3))

    run._coordinate()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [2], "the interval lets the batches between go"
    assert sorted(sink.committed) == [0, 1, 2]


def test_an_idle_stream_checkpoints_and_commits_its_last_batch_once_the_interval_passed(catalog, tmp_path,
                                                                                       monkeypatch):
    """Issue #45 item 5: with ``checkpoint.interval`` above zero, the last batch before the
    input pauses was checkpointed and committed only when more input arrived (the
    coordinator thread's ticks did nothing); its output waited. A tick after the interval
    now checkpoints it. The clock is the coordinator module's, moved by hand."""
    from airflow_sparkpoint.runtime import checkpointer as checkpointer_module

    now = [1000.0]
    monkeypatch.setattr(checkpointer_module.time, "monotonic", lambda: now[0])
    live, sink = tmp_path / "live", RecordingSink()
    run = _run(catalog, live, sink, [], interval_s=60)
    run.cfg = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/tmp/unused", "spark.sparkpoint.job": "job",
                                          "spark.sparkpoint.stateStore": "hdfs",
                                          "spark.sparkpoint.checkpoint.interval": "60s"})
    _staged(catalog, run, live, range(2))
    next_poll = run._handle("progress", 0, 0.0)  # the first batch: checkpointed (the first is due at once)
    next_poll = run._handle("progress", 1, next_poll)  # within the interval: not yet
    assert [m.batch_id for m in catalog.checkpoints()] == [0]

    next_poll = run._handle("tick", None, next_poll)  # the input paused; the interval has not passed
    assert [m.batch_id for m in catalog.checkpoints()] == [0]
    now[0] += 61
    run._handle("tick", None, next_poll)  # no new input, the interval has passed

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [1, 0], "the idle stream's last batch waits for input"
    assert sorted(sink.committed) == [0, 1]
