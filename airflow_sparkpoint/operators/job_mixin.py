"""The prologue every Sparkpoint operator and sensor shares: which job, where its store
is (a storage root or a ``sparkpoint`` connection), the hook that opens it, and the
checks of the arguments they have in common."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import conf

from airflow_sparkpoint import durations
from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook, storage_connection

__all__ = ["SparkpointJobMixin", "default_deferrable", "positive_seconds"]


class SparkpointJobMixin:
    """The job an Airflow task acts on: `job_name`, and its storage root
    (`checkpoint_dir`) or a ``sparkpoint`` connection (`sparkpoint_conn_id`).
    `sparkpoint_hook` (also `hook`) opens it."""

    job_name: str
    checkpoint_dir: str | None
    sparkpoint_conn_id: str | None

    def _init_job(self, job_name: str, checkpoint_dir: str | None, sparkpoint_conn_id: str | None) -> None:
        """Set the job and where its store is: the connection `sparkpoint_conn_id`, the
        storage root `checkpoint_dir` (its URI wins over the connection's), or, with
        neither, the ``sparkpoint_default`` connection (`storage_connection`)."""
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)

    @cached_property
    def sparkpoint_hook(self) -> SparkpointHook:
        return SparkpointHook(self.sparkpoint_conn_id, storage_uri=self.checkpoint_dir)

    @property
    def hook(self) -> SparkpointHook:
        """The job's hook (`sparkpoint_hook`), under the name thin operators use."""
        return self.sparkpoint_hook


def positive_seconds(name: str, value: Any) -> float:
    """A duration argument (seconds, a timedelta or a string like ``"10 minutes"``) as
    seconds > 0.

    :raises ConfigError: anything else, None included (the message names `name`).
    """
    return durations.seconds(name, value)


def default_deferrable(deferrable: bool | None) -> bool:
    """`deferrable`, or when None Airflow's ``[operators] default_deferrable``."""
    if deferrable is None:
        return conf.getboolean("operators", "default_deferrable", fallback=False)
    return bool(deferrable)
