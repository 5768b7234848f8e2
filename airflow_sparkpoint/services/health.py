"""Checkpoint health from the history model: Flink-named metrics, their Prometheus text
(`sparkpoint metrics`, the UI's metrics route, the operators' Airflow metrics), and the
health check behind the alerting operator (`check_job`).

Pure Python over a `PipelineHistory`: no Spark, no Airflow. The metric names and their
meaning are a public contract (docs/CLI.md, ``metrics``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import durations
from airflow_sparkpoint.checkpoints.history import PipelineHistory, load_history
from airflow_sparkpoint.exceptions import ConfigError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = [
    "METRICS", "HealthReport", "Metric", "check_health", "check_job", "load_for_metrics", "metric_values",
    "prometheus_text", "validate_thresholds",
]

PREFIX = "sparkpoint_"


@dataclass(frozen=True)
class Metric:
    name: str  # Flink's name, without the prefix
    type: str  # counter | gauge
    help: str


METRICS: tuple[Metric, ...] = (
    Metric("numberOfCompletedCheckpoints", "counter", "checkpoints completed by the job, ever"),
    Metric("numberOfFailedCheckpoints", "counter", "checkpoints that failed or were abandoned, ever"),
    Metric("numberOfRestoredCheckpoints", "counter", "runs that restored a checkpoint or savepoint"),
    Metric("lastCheckpointDuration", "gauge", "milliseconds the latest completed checkpoint took"),
    Metric("lastCheckpointSize", "gauge", "bytes the latest completed checkpoint copied (incremental)"),
    Metric("lastCheckpointFullSize", "gauge", "bytes of state the latest completed checkpoint references"),
    Metric("lastCompletedCheckpointAgeSeconds", "gauge", "seconds since the latest completed checkpoint"),
    Metric("heartbeatAgeSeconds", "gauge", "seconds since the running generation's last heartbeat"),
    Metric("generation", "gauge", "current generation"),
)


def load_for_metrics(catalog: Catalog, *, max_heartbeat_age: float = 60.0) -> PipelineHistory:
    """The history `metric_values` and `check_health` need: all of it but the savepoints,
    which neither reads (a job that takes one every 10 minutes and keeps them has thousands: every
    scrape or emission would read each one's listing, ``_metadata`` and drill record).

    :raises StorageError: the store cannot be listed.
    """
    return load_history(catalog, max_heartbeat_age=max_heartbeat_age, savepoints=False)


def metric_values(history: PipelineHistory) -> dict[str, float | None]:
    """Each metric of `METRICS` for one job; None when it has no value (no checkpoint yet,
    no status record)."""
    counts = history.counts
    latest = history.latest_completed
    status = history.status
    return {
        "numberOfCompletedCheckpoints": counts.completed,
        "numberOfFailedCheckpoints": counts.failed,
        "numberOfRestoredCheckpoints": counts.restored,
        "lastCheckpointDuration": None if latest is None else latest.duration_ms,
        "lastCheckpointSize": None if latest is None else latest.bytes_copied,
        "lastCheckpointFullSize": None if latest is None else latest.bytes_total,
        "lastCompletedCheckpointAgeSeconds": history.age_of_latest(),
        "heartbeatAgeSeconds": None if status is None else history.heartbeat_age,
        "generation": history.generation,
    }


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _number(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and math.isfinite(value)):
        return str(int(value))
    return repr(float(value))


def prometheus_text(samples: Iterable[tuple[Mapping[str, str], PipelineHistory]]) -> str:
    """Prometheus text exposition (version 0.0.4) of every metric of each history, one
    sample per metric and job, labelled with the given labels (``job`` at least).
    Metrics without a value are left out."""
    rows = [(dict(labels), metric_values(history)) for labels, history in samples]
    lines: list[str] = []
    for metric in METRICS:
        name = PREFIX + metric.name
        lines.append(f"# HELP {name} {metric.help}")
        lines.append(f"# TYPE {name} {metric.type}")
        for labels, values in rows:
            value = values[metric.name]
            if value is None:
                continue
            for key in labels:
                if not _LABEL_NAME.match(key):
                    raise ValueError(f"metric label name {key!r} is invalid")
            text = ",".join(f'{k}="{_label_value(str(v))}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{text}}} {_number(value)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the health check


@dataclass(frozen=True)
class HealthReport:
    """The outcome of `check_health`: healthy iff `problems` is empty; `figures` are what
    was measured (JSON-safe, for XCom and logs)."""

    job: str
    problems: tuple[str, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "healthy": self.healthy, "problems": list(self.problems),
                **dict(self.figures)}


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            (value < 0 if allow_zero else value <= 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name}={value!r} is invalid; expected a number {bound}")
    return float(value)


def validate_thresholds(
    *,
    max_checkpoint_age: Any = None,
    max_failure_ratio: Any = None,
    failure_window: Any = 10,
    max_heartbeat_age: Any = None,
) -> tuple[float | None, float | None, int, float | None]:
    """The thresholds as numbers: (checkpoint age s, failure ratio, window, heartbeat age s).

    :raises ConfigError: a value is out of range (the message names it), or none is given.
    """
    age = durations.optional_seconds("max_checkpoint_age", max_checkpoint_age)
    ratio = _positive("max_failure_ratio", max_failure_ratio, allow_zero=True)
    if ratio is not None and ratio >= 1:
        raise ConfigError(f"max_failure_ratio={max_failure_ratio!r} is invalid; expected a ratio in [0, 1)")
    if isinstance(failure_window, bool) or not isinstance(failure_window, int) or failure_window < 1:
        raise ConfigError(f"failure_window={failure_window!r} is invalid; expected "
                          "an integer >= 1 (attempts)")
    heartbeat = durations.optional_seconds("max_heartbeat_age", max_heartbeat_age)
    if age is None and ratio is None and heartbeat is None:
        raise ConfigError("a health check needs at least one of max_checkpoint_age, max_failure_ratio, "
                          "max_heartbeat_age")
    return age, ratio, failure_window, heartbeat


def check_health(
    history: PipelineHistory,
    *,
    max_checkpoint_age: Any = None,
    max_failure_ratio: Any = None,
    failure_window: Any = 10,
    max_heartbeat_age: Any = None,
) -> HealthReport:
    """Check the job against the thresholds given (None: not checked).

    - `max_checkpoint_age`: the latest completed checkpoint is at most this many seconds
      old (no completed checkpoint at all is a problem);
    - `max_failure_ratio`: failed / attempted over the newest `failure_window` checkpoint
      attempts is at most this (0.2: at most one in five failed);
    - `max_heartbeat_age`: the job is running (starting/running, not superseded) and its
      heartbeat is at most this many seconds old.

    :raises ConfigError: a threshold is invalid.
    """
    age_limit, ratio_limit, window, heartbeat_limit = validate_thresholds(
        max_checkpoint_age=max_checkpoint_age, max_failure_ratio=max_failure_ratio,
        failure_window=failure_window, max_heartbeat_age=max_heartbeat_age)
    problems: list[str] = []
    job = history.job
    figures: dict[str, Any] = {"generation": history.generation}
    if age_limit is not None:
        latest = history.latest_completed
        age = history.age_of_latest()
        figures.update(latest_checkpoint_id=None if latest is None else latest.id,
                       latest_checkpoint_age_s=age)
        if latest is None or age is None:
            problems.append(f"job {job!r} has no completed checkpoint (expected one "
                            f"younger than {age_limit:g} s)")
        elif age > age_limit:
            problems.append(f"job {job!r}: the latest completed checkpoint "
                            f"chk-{latest.id} is {age:.0f} s old "
                            f"(max {age_limit:g} s)")
    if ratio_limit is not None:
        ratio, attempts = _failure_ratio(history, window)
        figures.update(failure_ratio=ratio, attempts=attempts)
        if ratio is not None and ratio > ratio_limit:
            failed = round(ratio * attempts)
            problems.append(f"job {job!r}: {failed} of the last {attempts} checkpoint attempts failed "
                            f"(ratio {ratio:.2f}, max {ratio_limit:g})")
    if heartbeat_limit is not None:
        status = history.status
        figures.update(state=None if status is None else status.state, heartbeat_age_s=history.heartbeat_age)
        if status is None:
            problems.append(f"job {job!r} has no status record: it never ran (expected a running job)")
        elif status.generation < history.generation:
            problems.append(f"job {job!r}: generation {history.generation} was claimed but never reported a "
                            f"status (the last status is of generation {status.generation})")
        elif status.state not in ("starting", "running"):
            detail = f": {status.error}" if status.error else ""
            problems.append(f"job {job!r} is not running: generation {status.generation} "
                            f"{status.state}{detail}")
        elif history.heartbeat_age is not None and history.heartbeat_age > heartbeat_limit:
            problems.append(f"job {job!r}: the heartbeat of generation {status.generation} is "
                            f"{history.heartbeat_age:.0f} s old (max {heartbeat_limit:g} s): the driver died "
                            f"or hangs (host {status.host or '?'}, pid {status.pid or '?'})")
    return HealthReport(job, tuple(problems), figures)


def _failure_ratio(history: PipelineHistory, window: int) -> tuple[float | None, int]:
    """Over the newest `window` attempts: from the counters record, else from the retained
    directories (valid vs abandoned ones, the best a job without counters can tell)."""
    if history.counters is not None and history.counters.recent:
        return history.counters.failure_ratio(window)
    attempts = sorted([*history.completed, *history.failed], key=lambda r: r.id)[-window:]
    if not attempts:
        return None, 0
    return sum(1 for r in attempts if not r.valid) / len(attempts), len(attempts)


def check_job(
    catalog: Catalog,
    *,
    max_checkpoint_age: Any = None,
    max_failure_ratio: Any = None,
    failure_window: Any = 10,
    max_heartbeat_age: Any = None,
) -> tuple[PipelineHistory, HealthReport]:
    """The health check of `catalog`'s job (`check_health` over `load_for_metrics`, a
    heartbeat older than `max_heartbeat_age`, default 60 s, counting as not alive), with
    the history it read (for its metrics).

    :raises ConfigError: a threshold is invalid, or none is given.
    :raises StorageError: the store cannot be listed.
    """
    seconds = durations.optional_seconds("max_heartbeat_age", max_heartbeat_age)
    history = load_for_metrics(catalog, max_heartbeat_age=seconds or 60.0)
    report = check_health(history, max_checkpoint_age=max_checkpoint_age, max_failure_ratio=max_failure_ratio,
                          failure_window=failure_window, max_heartbeat_age=max_heartbeat_age)
    return history, report
