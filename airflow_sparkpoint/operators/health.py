"""`SparkpointHealthCheckOperator`: alert on checkpoint health in one line, and
`emit_checkpoint_metrics`: Flink's checkpoint metrics through Airflow's metrics.

The check fails the task (so Airflow's notifiers and ``on_failure_callback`` fire) when
the latest completed checkpoint is too old, too many of the newest checkpoint attempts
failed, or the job's heartbeat is stale. The figures come from the history model
(`services.health.check_job`), like `sparkpoint status` and the UI page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.operators.job_mixin import SparkpointJobMixin
from airflow_sparkpoint.services.health import check_job, load_for_metrics, metric_values, validate_thresholds
from airflow_sparkpoint.services.history import PipelineHistory
from airflow_sparkpoint.services.stores import Catalog

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["EMIT_EVERY", "SparkpointHealthCheckOperator", "emit_checkpoint_metrics", "emit_metrics_for"]

log = logging.getLogger(__name__)

#: a job's metrics are emitted at most this often per process (a sensor pokes every few seconds)
EMIT_EVERY = 30.0
_last_emit: dict[str, float] = {}
_emit_lock = threading.Lock()


def emit_checkpoint_metrics(history: PipelineHistory) -> dict[str, float | None]:
    """Send the job's checkpoint metrics (docs/CLI.md names) as gauges through Airflow's
    Stats, to whatever the deployment configured (StatsD, OpenTelemetry, or nothing):
    ``sparkpoint.<metric>`` tagged ``job=<name>`` and ``sparkpoint.<job>.<metric>`` for
    StatsD without tags. Returns the values. Never raises: metrics must not fail a task."""
    values = metric_values(history)
    try:
        from airflow.sdk.observability.stats import Stats

        job = history.job.replace(".", "__")
        for name, value in values.items():
            if value is None:
                continue
            Stats.gauge(f"sparkpoint.{name}", value, tags={"job": history.job})
            Stats.gauge(f"sparkpoint.{job}.{name}", value)
    except Exception as exc:  # noqa: BLE001 - a metrics backend problem is not the task's
        log.warning("could not emit the checkpoint metrics of job %r: %s", history.job, exc)
    return values


def emit_metrics_for(catalog: Catalog, *, every: float = EMIT_EVERY) -> None:
    """`emit_checkpoint_metrics` of `catalog`'s job, at most once per `every` seconds per
    job in this process (0: always). Never raises."""
    key = catalog.uri
    now = time.monotonic()
    with _emit_lock:
        if every and now - _last_emit.get(key, -every) < every:
            return
        _last_emit[key] = now
    try:
        emit_checkpoint_metrics(load_for_metrics(catalog))
    except Exception as exc:  # noqa: BLE001 - never fail a task for its metrics
        log.warning("could not read the checkpoint metrics of job %r: %s", catalog.job, exc)


class SparkpointHealthCheckOperator(SparkpointJobMixin, BaseOperator):
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
        self._init_job(job_name, checkpoint_dir, sparkpoint_conn_id)
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
