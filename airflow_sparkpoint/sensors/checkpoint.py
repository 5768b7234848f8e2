"""`SparkpointCheckpointSensor`: wait for a completed checkpoint, a savepoint or healthy
progress of a Sparkpoint job (of a given generation); fail fast when the job failed,
was superseded or died. The condition lives in `airflow_sparkpoint.services.conditions`,
shared with the deferrable trigger.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute, default_deferrable, positive_seconds
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink
from airflow_sparkpoint.operators.metrics import emit_metrics_for
from airflow_sparkpoint.services.conditions import (
    CheckpointCondition,
    Outcome,
    epoch_seconds,
    evaluate,
    optional_int,
    optional_seconds,
)
from airflow_sparkpoint.triggers.checkpoint import SparkpointCheckpointTrigger
from airflow_sparkpoint.triggers.shared import check_event

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SparkpointCheckpointSensor"]


class SparkpointCheckpointSensor(BaseSensorOperator):
    """Wait until a Sparkpoint job reaches a checkpoint condition.

    :param job_name: the pipeline (templated).
    :param checkpoint_dir: storage root (templated); or `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection (default ``sparkpoint_default`` when no
        `checkpoint_dir` is given).
    :param after_checkpoint_id: a completed checkpoint with a larger id (templated).
    :param after_time: completed after this datetime / epoch seconds / ISO timestamp (templated).
    :param generation: of this job generation (templated); fails when it is superseded.
    :param min_checkpoints: at least this many matching checkpoints (of `generation`: the
        run's own count, so it may exceed ``numRetained``).
    :param savepoint: wait for a completed savepoint (newer than `after_time`) instead.
    :param progress_within: also require healthy progress: heartbeat and newest checkpoint
        younger than this many seconds.
    :param max_heartbeat_age: a running job with an older heartbeat has died: fail.
    :param deferrable: wait in the triggerer instead of a worker slot (default:
        ``[operators] default_deferrable``).

    Durations (`progress_within`, `max_heartbeat_age`) are seconds, a timedelta or a
    duration string (``"5 minutes"``). Fails with `AirflowException` (without waiting out
    `timeout`) when the job's status says failed, the generation is superseded, the
    heartbeat is stale, or the job finished / stopped before the condition held. With
    ``soft_fail=True`` every one of these, a timeout and a trigger error skip instead,
    in poke and deferrable mode alike. Returns (XCom) the matching snapshot:
    ``checkpoint_id``/``checkpoint_uri`` or ``savepoint_id``/``savepoint_uri``, with
    ``generation``, ``batch_id``, ``created_at`` and ``count``.
    """

    template_fields: Sequence[str] = (
        "job_name",
        "checkpoint_dir",
        "generation",
        "after_checkpoint_id",
        "after_time",
    )
    ui_color = "#e8f4fd"
    operator_extra_links = (SparkpointCheckpointHistoryLink(),)
    sparkpoint_hook = JobHookAttribute()  # the job's store, as rendered
    hook = JobHookAttribute(alias=True)

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        after_checkpoint_id: int | str | None = None,
        after_time: datetime | float | str | None = None,
        generation: int | str | None = None,
        min_checkpoints: int = 1,
        savepoint: bool = False,
        progress_within: float | timedelta | str | None = None,
        max_heartbeat_age: float | timedelta | str = 60.0,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5.0)
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        if optional_int("min_checkpoints", min_checkpoints, minimum=1) is None:
            raise ConfigError("min_checkpoints=None is invalid; expected an integer >= 1")
        progress_within = optional_seconds("progress_within", progress_within)
        self.max_heartbeat_age = positive_seconds("max_heartbeat_age", max_heartbeat_age)
        self.after_checkpoint_id = after_checkpoint_id
        self.after_time = after_time
        self.generation = generation
        self.min_checkpoints = min_checkpoints
        self.savepoint = savepoint
        self.progress_within = progress_within
        self.deferrable = default_deferrable(deferrable)

    def condition(self) -> CheckpointCondition:
        """The condition from the (rendered) fields.

        :raises ConfigError: a field does not parse (the message names it).
        """
        return CheckpointCondition(
            job_name=self.job_name,
            after_checkpoint_id=optional_int("after_checkpoint_id", self.after_checkpoint_id),
            after_time=epoch_seconds("after_time", self.after_time),
            generation=optional_int("generation", self.generation, minimum=1),
            min_checkpoints=self.min_checkpoints,
            savepoint=self.savepoint,
            progress_within=optional_seconds("progress_within", self.progress_within),
            max_heartbeat_age=float(self.max_heartbeat_age),
        )

    def _check(self, condition: CheckpointCondition) -> Outcome:
        """One look. A condition that can never hold fails the task, or skips it with
        `soft_fail` / `never_fail` (in poke mode Airflow only does that for timeouts).

        :raises AirflowException: the job failed, was superseded, died or ended early.
        :raises AirflowSkipException: the same, with `soft_fail` or `never_fail`.
        """
        catalog = self.hook.get_catalog(condition.job_name)
        emit_metrics_for(catalog)  # checkpoint metrics through Airflow's Stats (rate-limited, never raises)
        outcome = evaluate(catalog, condition)
        if outcome.error is not None:
            error = self.hook.scrub(outcome.error)  # it may quote a record's error text
            if self.soft_fail or getattr(self, "never_fail", False):
                raise AirflowSkipException(f"{error} (skipped: soft_fail)")
            raise AirflowException(error)
        if not outcome.done:
            self.log.info("waiting for %s", outcome.waiting_for)
        return outcome

    def poke(self, context: Context) -> bool | PokeReturnValue:
        outcome = self._check(self.condition())
        if outcome.done:
            self.log.info("condition met: %s", dict(outcome.payload))
            return PokeReturnValue(is_done=True, xcom_value=dict(outcome.payload))
        return False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        condition = self.condition()
        outcome = self._check(condition)
        if outcome.done:
            self.log.info("condition already met: %s", dict(outcome.payload))
            return dict(outcome.payload)
        self.defer(
            trigger=SparkpointCheckpointTrigger(
                mode="checkpoint",
                checkpoint_dir=self.checkpoint_dir,
                sparkpoint_conn_id=self.sparkpoint_conn_id,
                poll_interval=max(float(self.poke_interval), 0.1),
                deadline=time.time() + float(self.timeout),
                **condition.to_json(),
            ),
            method_name="execute_complete",
            # The trigger's own deadline reports what was missing; this is the backstop.
            timeout=timedelta(seconds=float(self.timeout) + 60),
        )

    def execute_complete(self, context: Context, event: Any = None) -> dict[str, Any]:
        """Resume after the trigger: return the snapshot, or raise its error.

        :raises AirflowException: an error event or a malformed one.
        """
        key = "savepoint_uri" if self.savepoint else "checkpoint_uri"
        payload = check_event(event, required=(key, "generation"))
        self.log.info("condition met: %s", payload)
        return payload
