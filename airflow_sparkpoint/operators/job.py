"""The part every Sparkpoint operator and sensor holds for its job: the hook that opens
the job's store (`JobHook`, which the operator's `JobHookAttribute` class attributes
``sparkpoint_hook`` and ``hook`` read), and the checks of the arguments they have in
common.

The job itself (`job_name`, its storage root `checkpoint_dir` or the ``sparkpoint``
connection `sparkpoint_conn_id`, resolved by `storage_connection`) stays on the
operator: those are its template fields, rendered on it at run time.
"""

from __future__ import annotations

from typing import Any, overload

from airflow.sdk import conf

from airflow_sparkpoint import durations
from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

__all__ = ["JobHook", "JobHookAttribute", "default_deferrable", "positive_seconds"]


class JobHook:
    """The `SparkpointHook` of an operator's job, made on first use and made again when
    the connection or storage root it is asked for changed (the operator asks with its
    fields when it needs the hook, so a hook made before rendering is not kept)."""

    def __init__(self) -> None:
        self._made: tuple[str | None, str | None, SparkpointHook] | None = None

    def of(self, sparkpoint_conn_id: str | None, checkpoint_dir: str | None) -> SparkpointHook:
        """The hook of the connection `sparkpoint_conn_id` and the storage root
        `checkpoint_dir` (its URI wins over the connection's)."""
        if self._made is None or self._made[:2] != (sparkpoint_conn_id, checkpoint_dir):
            hook = SparkpointHook(sparkpoint_conn_id, storage_uri=checkpoint_dir)
            self._made = (sparkpoint_conn_id, checkpoint_dir, hook)
        return self._made[2]


class JobHookAttribute:
    """An operator's ``sparkpoint_hook`` (``sparkpoint_hook = JobHookAttribute()``): the
    hook of its `sparkpoint_conn_id` and `checkpoint_dir` as they stand when asked
    (rendered at run time), through the `JobHook` it holds as ``_job_hook``. With
    ``alias=True`` (``hook = JobHookAttribute(alias=True)``, the name thin operators use)
    it is the operator's ``sparkpoint_hook``, also where a subclass replaces that (the
    drill's scratch hook)."""

    def __init__(self, *, alias: bool = False) -> None:
        self.alias = alias

    @overload
    def __get__(self, op: None, owner: type) -> JobHookAttribute: ...

    @overload
    def __get__(self, op: object, owner: type | None = None) -> SparkpointHook: ...

    def __get__(self, op: Any, owner: type | None = None) -> Any:
        if op is None:
            return self
        if self.alias:
            return op.sparkpoint_hook
        return op._job_hook.of(op.sparkpoint_conn_id, op.checkpoint_dir)


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
