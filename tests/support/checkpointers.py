"""A run's checkpointer without Spark, as the run's start-up builds it: an in-memory
catalog (the `catalog` fixture), the checkpointer and its committer fenced by a
generation, the commit step after a checkpoint, and a run's config for restore plans."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.runtime.checkpointer import Checkpointer
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.storage import MemoryStorage

__all__ = ["catalog", "checkpointer", "commit", "run_config"]


@pytest.fixture()
def catalog() -> Catalog:
    """A catalog of job ``job`` on fresh in-memory storage."""
    return Catalog(MemoryStorage(uuid.uuid4().hex), "job")


def checkpointer(catalog: Catalog, live: Path, sink: Sink, generation: int, *,
                 commit_mode: str = "checkpoint", **kw: Any) -> Checkpointer:
    """A run's checkpointer and its committer (`Checkpointer.transactions`), fenced by
    `generation`, as the run's start-up builds them."""
    options: dict[str, Any] = {"interval_s": 0, "num_retained": 2, "timeout_s": 60, "tolerable_failures": 0}
    options.update(kw)
    fence = Fence(catalog, generation)
    committer = Committer(catalog=catalog, sink=sink, fence=fence, commit_mode=commit_mode)
    return Checkpointer(catalog=catalog, fence=fence, live_root=str(live), transactions=committer, **options)


def commit(coord: Checkpointer) -> list[int]:
    """Commit what the last checkpoint confirmed, as the coordinator thread does after it."""
    return coord.transactions.commit_confirmed(coord.last_checkpoint)


def run_config(**kw: str) -> SparkpointConfig:
    """The config of a run of job ``job`` with ``spark.sparkpoint.<key>`` = value for each of `kw`."""
    return SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/unused", "spark.sparkpoint.job": "job",
                                       **{f"spark.sparkpoint.{k}": v for k, v in kw.items()}})
