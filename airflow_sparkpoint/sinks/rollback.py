"""Abort a stopped generation's output: the one home of this use case (blue-green
rollback), for `sparkpoint commit --abort-generation` and `SparkpointCommitOperator`.

A generation that is still live (`checkpoints.history.live_status`) is refused: its
driver would go on staging and committing. Otherwise everything it staged and did not
commit is aborted by `sinks.commit.abort_generation`. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.history import live_status
from airflow_sparkpoint.exceptions import GenerationRunning
from airflow_sparkpoint.sinks.commit import abort_generation
from airflow_sparkpoint.sinks.resolve import SinkSpec

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["abort_stopped_generation"]


def abort_stopped_generation(
    catalog: Catalog,
    generation: int,
    *,
    max_heartbeat_age: float,
    how_to_stop: str,
    storage_options: Mapping[str, Any] | None = None,
    sink: SinkSpec | None = None,
) -> list[str]:
    """Abort every uncommitted transaction `generation` of `catalog`'s job staged (see
    `abort_generation`); return the aborted transaction ids.

    :param max_heartbeat_age: a run with a younger heartbeat is still live.
    :param how_to_stop: how the caller's user stops the run (named in the refusal).
    :param sink: the job's declared sink (see `commit_pending`).
    :raises GenerationRunning: `generation` is still live; nothing was aborted.
    :raises SinkError: an abort failed (see `abort_generation`).
    """
    live = live_status(catalog, max_heartbeat_age)
    if live is not None and live.generation == generation:
        raise GenerationRunning(
            f"generation {generation} of job {catalog.job!r} is still running (heartbeat younger than "
            f"{max_heartbeat_age:g} s); stop it first ({how_to_stop}) before aborting its output"
        )
    return abort_generation(catalog, generation, storage_options=storage_options, sink=sink)
