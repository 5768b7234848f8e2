"""`SparkpointHealthCheckOperator`: alert on checkpoint health in one line.

The check fails the task (so Airflow's notifiers and ``on_failure_callback`` fire) when
the latest completed checkpoint is too old, too many of the newest checkpoint attempts
failed, or the job's heartbeat is stale. The figures come from the history model
(`services.health.check_job`), like `sparkpoint status` and the UI page.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute

# the metrics' names stay importable from here, where they were first defined
from airflow_sparkpoint.operators.metrics import EMIT_EVERY, emit_checkpoint_metrics, emit_metrics_for
from airflow_sparkpoint.services.health import check_job, validate_thresholds

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["EMIT_EVERY", "SparkpointHealthCheckOperator", "emit_checkpoint_metrics", "emit_metrics_for"]

class SparkpointHealthCheckOperator(BaseOperator):
    """Fail when a Sparkpoint job's checkpoints are unhealthy; give at least one threshold.

    :param job_name: the pipeline (templated).
    :param checkpoint_dir: storage root (templated); or `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection (default ``sparkpoint_default`` when no
        `checkpoint_dir` is given).
    :param max_checkpoint_age: the latest completed checkpoint must be younger (seconds or
        a timedelta); no completed checkpoint at all fails.
    :param max_failure_ratio: at most this share of the newest `failure_window` checkpoint
        attempts may have failed (``0.2``: one in five).
    :param failure_window: how many of the newest attempts the ratio covers (default 10).
    :param max_heartbeat_age: the job must be running with a heartbeat younger than this
        (seconds or a timedelta); for long-running streaming jobs.

    Returns (XCom) the report: ``healthy``, ``problems`` and the measured figures.

    :raises AirflowException: the job is unhealthy (the message lists every problem).
    :raises ConfigError: a threshold is invalid, or none is given.
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_dir")
    ui_color = "#fdf2e8"
    sparkpoint_hook = JobHookAttribute()  # the job's store, as rendered
    hook = JobHookAttribute(alias=True)

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        max_checkpoint_age: float | timedelta | str | None = None,
        max_failure_ratio: float | None = None,
        failure_window: int = 10,
        max_heartbeat_age: float | timedelta | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        validate_thresholds(max_checkpoint_age=max_checkpoint_age, max_failure_ratio=max_failure_ratio,
                            failure_window=failure_window, max_heartbeat_age=max_heartbeat_age)
        self.max_checkpoint_age = max_checkpoint_age
        self.max_failure_ratio = max_failure_ratio
        self.failure_window = failure_window
        self.max_heartbeat_age = max_heartbeat_age

    def execute(self, context: Context) -> dict[str, Any]:
        history, report = check_job(self.hook.get_catalog(self.job_name),
                                    max_checkpoint_age=self.max_checkpoint_age,
                                    max_failure_ratio=self.max_failure_ratio,
                                    failure_window=self.failure_window,
                                    max_heartbeat_age=self.max_heartbeat_age)
        emit_checkpoint_metrics(history)
        if not report.healthy:
            raise AirflowException(f"Sparkpoint job {self.job_name!r} is unhealthy: "
                                   + "; ".join(report.problems))
        self.log.info("job %s is healthy: %s", self.job_name, dict(report.figures))
        return report.to_json()
