"""``checkpoint.interval=0`` means a retained checkpoint of every batch (docs/reference/config.md),
also when the coordinator thread falls behind Spark: progress events queued while a
checkpoint ran, or not yet seen by the commit watcher when the query ended, must not make it skip
the batches between (the flaky ``_first_run`` of tests/races/test_lineages.py retained
``[7, 5, 4]``: batch 6's progress event was queued behind 7's, or arrived after the end).

The real coordinator thread loop (`RunCoordinator.run`) on a stand-in run: a hand-made live
location, an in-memory catalog and a recording sink; Spark is replaced by the events queue.
"""

from __future__ import annotations

from airflow_sparkpoint.runtime.config import SparkpointConfig
from tests.support.checkpointers import catalog
from tests.support.coordinator_runs import coordinator_run, stage_batches
from tests.support.fake_sinks import RecordingSink

__all__ = ["catalog"]  # the fixture


def test_progress_events_queued_behind_each_other_still_checkpoint_every_batch(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    coordinator = coordinator_run(catalog, live, sink,
                                  [("progress", 0), ("progress", 1), ("progress", 2), ("final", None)])
    run = coordinator.state
    stage_batches(catalog, run, live, range(3))

    coordinator.run()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [2, 1, 0], "a batch was left without its checkpoint"
    assert sorted(sink.committed) == [0, 1, 2]


def test_batches_whose_progress_events_arrive_after_the_end_are_checkpointed_at_the_end(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    # 1 and 2: not yet seen by the watcher
    coordinator = coordinator_run(catalog, live, sink, [("progress", 0), ("final", None)])
    run = coordinator.state
    stage_batches(catalog, run, live, range(3))

    coordinator.run()

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [2, 1, 0], "a batch was left without its checkpoint"
    assert sorted(sink.committed) == [0, 1, 2]


def test_with_an_interval_only_the_newest_batch_is_checkpointed_when_it_is_due(catalog, tmp_path):
    live, sink = tmp_path / "live", RecordingSink()
    coordinator = coordinator_run(catalog, live, sink,
                                  [("progress", 0), ("progress", 1), ("progress", 2), ("final", None)],
               interval_s=3600)
    run = coordinator.state
    stage_batches(catalog, run, live, range(3))

    coordinator.run()

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
    coordinator = coordinator_run(catalog, live, sink, [], interval_s=60)
    run = coordinator.state
    run.cfg = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/tmp/unused",
                                          "spark.sparkpoint.job": "job",
                                          "spark.sparkpoint.stateStore": "hdfs",
                                          "spark.sparkpoint.checkpoint.interval": "60s"})
    stage_batches(catalog, run, live, range(2))
    # the first batch: checkpointed (the first is due at once)
    next_poll = coordinator.handle("progress", 0, 0.0)
    next_poll = coordinator.handle("progress", 1, next_poll)  # within the interval: not yet
    assert [m.batch_id for m in catalog.checkpoints()] == [0]

    next_poll = coordinator.handle("tick", None, next_poll)  # the input paused; the interval has not passed
    assert [m.batch_id for m in catalog.checkpoints()] == [0]
    now[0] += 61
    coordinator.handle("tick", None, next_poll)  # no new input, the interval has passed

    assert run.error is None, run.error
    assert [m.batch_id for m in catalog.checkpoints()] == [1, 0], \
        "the idle stream's last batch waits for input"
    assert sorted(sink.committed) == [0, 1]
