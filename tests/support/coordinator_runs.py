"""The real coordinator thread loop (`_Run._coordinate`) on a stand-in run: a hand-made
live location, an in-memory catalog and a recording sink; Spark is replaced by the
run's events queue."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.job import _Run
from tests.support.checkpointers import checkpointer
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live

__all__ = ["coordinator_run", "stage_batches"]


class _Control:
    """A control store with no requests."""

    def withdraw_superseded(self, generation: int) -> list[str]:
        return []

    def pending(self, generation: int) -> list[Any]:
        return []

    def cleanup(self, older_than_s: float = 86400, *, limit: int | None = None) -> int:
        return 0


def coordinator_run(catalog: Catalog, live: Path, sink: RecordingSink, events: list[tuple[str, Any]], **kw: Any) -> _Run:
    """A run whose query already processed batches (`write_live`, staged `recording_record`s) and
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


def stage_batches(catalog: Catalog, run: _Run, live: Path, batches: range) -> None:
    """Batches `batches` processed by the query of `run`: their live files written and
    their `recording_record`s staged and pending."""
    for batch in batches:
        write_live(live, batch)
        catalog.put_transaction(recording_record(batch, run.generation))
        run.committer.add_pending(recording_record(batch, run.generation))
