"""Metrics and the health check from the history model: Flink's names, Prometheus text,
and each alert condition tripping (and a healthy job passing)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.counters import CounterRecorder
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.health import (
    METRICS,
    check_health,
    metric_values,
    prometheus_text,
    validate_thresholds,
)
from airflow_sparkpoint.storage import open_storage
from tests.support.records import state_checkpoint, write_status


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(open_storage(str(tmp_path)), "orders")


def healthy_job(catalog: Catalog) -> None:
    catalog.claim_generation()
    recorder = CounterRecorder(catalog, 1)
    for batch in range(3):
        meta = state_checkpoint(catalog, batch, duration=40 + batch, copied=100 * (batch + 1))
        recorder.completed(meta.created_at)
    write_status(catalog, "running", last_batch=2)


def test_metric_values_use_flinks_names(catalog: Catalog) -> None:
    assert [m.name for m in METRICS] == [
        "numberOfCompletedCheckpoints", "numberOfFailedCheckpoints", "numberOfRestoredCheckpoints",
        "lastCheckpointDuration", "lastCheckpointSize", "lastCheckpointFullSize",
        "lastCompletedCheckpointAgeSeconds", "heartbeatAgeSeconds", "generation"]
    healthy_job(catalog)
    values = metric_values(load_history(catalog))
    latest = catalog.latest()
    assert latest is not None
    assert values["numberOfCompletedCheckpoints"] == 3 and values["numberOfFailedCheckpoints"] == 0
    assert values["lastCheckpointDuration"] == 42 and values["lastCheckpointSize"] == 300
    assert values["lastCheckpointFullSize"] == latest.total_bytes and values["generation"] == 1
    assert values["lastCompletedCheckpointAgeSeconds"] >= 0  # type: ignore[operator]
    assert values["heartbeatAgeSeconds"] is not None


def test_prometheus_text_has_help_type_and_one_labelled_sample_per_job(
    catalog: Catalog, tmp_path: Path
) -> None:
    healthy_job(catalog)
    empty = Catalog(open_storage(str(tmp_path)), "never_ran")
    text = prometheus_text([({"job": "orders"}, load_history(catalog)),
                            ({"job": 'we"ird\\'}, load_history(empty))])
    lines = text.splitlines()
    assert text.endswith("\n")
    assert "# HELP sparkpoint_numberOfCompletedCheckpoints checkpoints completed by the job, ever" in lines
    assert "# TYPE sparkpoint_numberOfCompletedCheckpoints counter" in lines
    assert "# TYPE sparkpoint_lastCheckpointDuration gauge" in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{job="orders"} 3' in lines
    assert 'sparkpoint_lastCheckpointDuration{job="orders"} 42' in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{job="we\\"ird\\\\"} 0' in lines
    # A job without a checkpoint or status has no duration or heartbeat sample.
    assert not any(line.startswith("sparkpoint_lastCheckpointDuration{job=\"we") for line in lines)
    assert not any(line.startswith("sparkpoint_heartbeatAgeSeconds{job=\"we") for line in lines)
    samples = [line for line in lines if not line.startswith("#")]
    for line in samples:  # name{labels} value
        name, value = line.rsplit(" ", 1)
        float(value)
        assert name.startswith("sparkpoint_") and name.endswith("}")


def test_a_healthy_job_passes_every_check(catalog: Catalog) -> None:
    healthy_job(catalog)
    report = check_health(load_history(catalog), max_checkpoint_age=timedelta(hours=1), max_failure_ratio=0.2,
                          failure_window=10, max_heartbeat_age=3600)
    assert report.healthy, report.problems
    assert report.to_json()["healthy"] is True and report.figures["failure_ratio"] == 0.0


def test_a_stale_last_checkpoint_trips(catalog: Catalog) -> None:
    catalog.claim_generation()
    state_checkpoint(catalog, 0, created_at=time.time() - 3600)
    write_status(catalog, "running")
    report = check_health(load_history(catalog), max_checkpoint_age=600)
    assert not report.healthy
    assert re.search(r"the latest completed checkpoint chk-1 is 36\d\d s old \(max 600 s\)",
                     report.problems[0])
    empty = Catalog(open_storage(str(Path(catalog.uri.removeprefix("file://")).parent)), "other")
    assert ("has no completed checkpoint"
            in check_health(load_history(empty), max_checkpoint_age=600).problems[0])


def test_a_failure_ratio_over_the_window_trips(catalog: Catalog) -> None:
    healthy_job(catalog)
    recorder = CounterRecorder(catalog, 1)
    recorder.failed()
    recorder.failed()
    history = load_history(catalog)
    assert check_health(history, max_failure_ratio=0.5, failure_window=4).healthy  # 2 of the last 4
    report = check_health(history, max_failure_ratio=0.5, failure_window=3)  # 2 of the last 3
    assert (report.problems
            == ("job 'orders': 2 of the last 3 checkpoint attempts failed (ratio 0.67, max 0.5)",))


def test_without_counters_the_ratio_comes_from_abandoned_directories(catalog: Catalog) -> None:
    catalog.claim_generation()
    state_checkpoint(catalog, 0)
    catalog.store.put("chk-2/partial", b"x")
    catalog.store.put("chk-3/partial", b"x")
    write_status(catalog, "failed", error="driver lost")
    report = check_health(load_history(catalog), max_failure_ratio=0.5)
    assert (report.problems
            == ("job 'orders': 2 of the last 3 checkpoint attempts failed (ratio 0.67, max 0.5)",))


@pytest.mark.parametrize(
    ("state", "age", "message"),
    [
        ("running", 300, "s old (max 60 s): the driver died or hangs"),
        ("failed", 0, "job 'orders' is not running: generation 1 failed: OOM"),
        ("stopped", 0, "job 'orders' is not running: generation 1 stopped"),
    ],
)
def test_a_stale_heartbeat_or_a_job_that_is_not_running_trips(catalog: Catalog, state: str, age: float,
                                                               message: str) -> None:
    healthy_job(catalog)
    write_status(catalog, state, heartbeat_age=age, error="OOM" if state == "failed" else None)
    report = check_health(load_history(catalog), max_heartbeat_age=60)
    assert len(report.problems) == 1 and message in report.problems[0]


def test_a_job_that_never_ran_or_was_superseded_without_a_status_trips(catalog: Catalog) -> None:
    report = check_health(load_history(catalog), max_heartbeat_age=60)
    assert "has no status record" in report.problems[0]
    healthy_job(catalog)
    catalog.claim_generation()
    report = check_health(load_history(catalog), max_heartbeat_age=60)
    assert "generation 2 was claimed but never reported a status" in report.problems[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs at least one of"),
        ({"max_checkpoint_age": 0}, "max_checkpoint_age=0 is invalid"),
        ({"max_failure_ratio": 1.5}, "max_failure_ratio=1.5 is invalid"),
        ({"max_failure_ratio": 0.1, "failure_window": 0}, "failure_window=0 is invalid"),
        ({"max_heartbeat_age": "soon"}, "max_heartbeat_age='soon' is invalid"),
    ],
)
def test_invalid_thresholds_are_refused_naming_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_thresholds(**kwargs)  # type: ignore[arg-type]
