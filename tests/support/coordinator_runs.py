"""The real coordinator thread loop (`RunCoordinator.run`) on a stand-in run: a hand-made
live location, an in-memory catalog and a recording sink; Spark is replaced by the
run's events queue."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.run_coordination import RunCoordinator
from airflow_sparkpoint.runtime.run_state import RunState
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


def coordinator_run(catalog: Catalog, live: Path, sink: RecordingSink, events: list[tuple[str, Any]],
                    **kw: Any) -> RunCoordinator:
    """The coordinator of a run whose query already processed batches (`write_live`, staged
    `recording_record`s) and whose coordinator thread has not looked at `events` yet; its
    state is `.state`."""
    generation = catalog.claim_generation().generation
    config = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/tmp/unused", "spark.sparkpoint.job": "job",
                                         "spark.sparkpoint.stateStore": "hdfs"})
    run = RunState(cfg=config, spark=SimpleNamespace(), df=None, sink=sink, output_mode="append",  # type: ignore[arg-type]
                   query_name=None, application_id="app-1")
    run.catalog = catalog
    run.generation = generation
    run.checkpointer = checkpointer(catalog, live, sink, generation, num_retained=10, **kw)
    run.committer = run.checkpointer.transactions
    run.live = str(live)
    run.control = _Control()  # type: ignore[assignment]
    for event in events:
        run.events.put(event)
    return RunCoordinator(run)


def stage_batches(catalog: Catalog, run: RunState, live: Path, batches: range) -> None:
    """Batches `batches` processed by the query of `run`: their live files written and
    their `recording_record`s staged and pending."""
    for batch in batches:
        write_live(live, batch)
        catalog.put_transaction(recording_record(batch, run.generation))
        run.committer.add_pending(recording_record(batch, run.generation))
