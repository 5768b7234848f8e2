"""Flink's checkpoint metrics through Airflow's metrics (`emit_checkpoint_metrics`), and
their rate-limited emission from a task (`emit_metrics_for`: the submit operator at a
run's end, the checkpoint sensor on its pokes). The figures are `services.health`'s.
"""

from __future__ import annotations

import logging
import threading
import time

from airflow_sparkpoint.services.health import load_for_metrics, metric_values
from airflow_sparkpoint.services.history import PipelineHistory
from airflow_sparkpoint.services.stores import Catalog

__all__ = ["EMIT_EVERY", "emit_checkpoint_metrics", "emit_metrics_for"]

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
