"""The health check a DAG author wires in one line: each condition fails the task (so the
failure callback fires), a healthy job passes, and the checkpoint metrics reach a real
StatsD listener (UDP on 127.0.0.1) through Airflow's Stats."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.counters import CounterRecorder
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import open_storage
from tests.support.paths import REPO
from tests.support.records import state_checkpoint, write_status

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def healthy(root: Path) -> Catalog:
    catalog = Catalog(open_storage(str(root)), "orders")
    catalog.claim_generation()
    recorder = CounterRecorder(catalog, 1)
    for batch in range(3):
        recorder.completed(state_checkpoint(catalog, batch).created_at)
    write_status(catalog, "running")
    return catalog


def run_check(root: Path, **thresholds: Any) -> tuple[str, list[str], Any]:
    """dag.test() one health check; returns (task state, failure callback messages, XCom)."""
    from airflow.sdk import DAG

    from airflow_sparkpoint.operators import SparkpointHealthCheckOperator

    alerts: list[str] = []
    with DAG(dag_id=f"health_{time.monotonic_ns()}", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        SparkpointHealthCheckOperator(task_id="health", job_name="orders", checkpoint_dir=str(root),
                                      on_failure_callback=lambda ctx: alerts.append(
                                          str(ctx.get("exception"))),
                                      **thresholds)
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:  # dag.test() needs the DAG serialized first
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.commit()
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
    run = dag.test()
    (ti,) = run.get_task_instances()
    return str(ti.state), alerts, ti.xcom_pull(task_ids="health")


def test_a_healthy_job_passes_and_returns_its_figures(tmp_path: Path) -> None:
    healthy(tmp_path)
    # Generous ages: a loaded machine may take minutes between writing and checking.
    state, alerts, report = run_check(tmp_path, max_checkpoint_age=timedelta(hours=1), max_failure_ratio=0.2,
                                      max_heartbeat_age=timedelta(hours=1))
    assert (state, alerts) == ("success", [])
    assert report["healthy"] is True and report["problems"] == [] and report["failure_ratio"] == 0.0


@pytest.mark.parametrize(
    ("break_it", "thresholds", "message"),
    [
        ("old", {"max_checkpoint_age": timedelta(minutes=10)}, "s old (max 600 s)"),
        ("failing", {"max_failure_ratio": 0.2, "failure_window": 5},
         "3 of the last 5 checkpoint attempts failed"),
        ("dead", {"max_heartbeat_age": timedelta(minutes=2)}, "s old (max 120 s): the driver died or hangs"),
    ],
)
def test_each_condition_fails_the_task_and_fires_the_failure_callback(tmp_path: Path, break_it: str,
                                                                       thresholds: dict[str, Any],
                                                                       message: str) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), "orders")
    catalog.claim_generation()
    recorder = CounterRecorder(catalog, 1)
    if break_it == "old":
        state_checkpoint(catalog, 0, created_at=time.time() - 7200)
        write_status(catalog, "running")
    elif break_it == "failing":
        for ok in (True, True, False, False, False):
            (recorder.completed if ok else recorder.failed)()
        state_checkpoint(catalog, 0)
        write_status(catalog, "running")
    else:
        state_checkpoint(catalog, 0)
        write_status(catalog, "running", heartbeat_age=900)
    state, alerts, _ = run_check(tmp_path, **thresholds)
    assert state == "failed"
    assert len(alerts) == 1 and "Sparkpoint job 'orders' is unhealthy" in alerts[0] and message in alerts[0]


def test_thresholds_are_checked_when_the_dag_is_parsed() -> None:
    from airflow_sparkpoint.operators import SparkpointHealthCheckOperator

    with pytest.raises(ConfigError, match="needs at least one of"):
        SparkpointHealthCheckOperator(task_id="h", job_name="orders", checkpoint_dir="/x")
    # Neither checkpoint_dir nor a connection: the default connection
    # (tests/unit/airflow/test_api_defaults.py).
    assert SparkpointHealthCheckOperator(task_id="h", job_name="orders",
                                         max_heartbeat_age=60).sparkpoint_conn_id \
        == "sparkpoint_default"


def test_the_example_dag_alerts_on_a_dead_job(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    catalog = healthy(tmp_path)
    write_status(catalog, "failed", error="executor lost")
    # The DAG reads its storage from the sparkpoint_default connection, as a deployment does.
    monkeypatch.setenv("AIRFLOW_CONN_SPARKPOINT_DEFAULT",
                       json.dumps({"conn_type": "sparkpoint", "host": str(tmp_path)}))
    dag = DagBag(str(REPO / "dags" / "example_sparkpoint_health.py")).get_dag("example_sparkpoint_health")
    assert dag is not None
    run = dag.test(run_conf={"job_name": "orders"})
    assert run.state == "failed"
    assert "Sparkpoint checkpoint alert for orders" in caplog.text and "executor lost" in caplog.text


def test_metrics_reach_a_statsd_listener_through_airflows_stats(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability.metrics import stats_utils
    from airflow.sdk.observability.stats import initialize

    from airflow_sparkpoint.operators.metrics import emit_checkpoint_metrics

    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(10)
    for key, value in (("statsd_on", "True"), ("statsd_host", "127.0.0.1"),
                       ("statsd_port", str(listener.getsockname()[1])), ("statsd_prefix", "airflow")):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key.upper()}", value)
    assert conf.getboolean("metrics", "statsd_on")
    initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        values = emit_checkpoint_metrics(load_history(healthy(tmp_path)))
        packets: list[str] = []
        while not any("lastCheckpointDuration" in p for p in packets) or len(packets) < 4:
            packets.extend(listener.recv(65536).decode().splitlines())
    finally:
        client = getattr(stats_module._get_backend(), "statsd", None)
        if client is not None:
            client.close()  # the StatsD client's UDP socket
        monkeypatch.undo()
        initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        listener.close()
    assert "airflow.sparkpoint.numberOfCompletedCheckpoints:3|g" in packets
    assert "airflow.sparkpoint.orders.numberOfCompletedCheckpoints:3|g" in packets
    assert f"airflow.sparkpoint.lastCheckpointDuration:{values['lastCheckpointDuration']}|g" in packets


def test_the_metrics_and_the_health_check_read_no_savepoint(tmp_path: Path) -> None:
    """Savepoints are kept until deleted (one every 10 minutes is 144 a day): the metrics
    every sensor emits, every scrape and `sparkpoint metrics` read none of them, and their
    figures are those of the whole history."""
    from airflow_sparkpoint.operators.metrics import emit_metrics_for
    from airflow_sparkpoint.storage.counting import CountingStorage

    catalog = healthy(tmp_path)
    for _ in range(5):
        catalog.create_savepoint(catalog.handle(catalog.latest()), generation=1)  # type: ignore[arg-type]
    counting = CountingStorage(catalog.storage)
    counted = Catalog(counting, catalog.job)

    emit_metrics_for(counted, every=0)
    assert counting.log and not [key for _op, key in counting.log if "/savepoints" in key], counting.log
    from airflow_sparkpoint.services.health import check_health, load_for_metrics, metric_values

    whole = load_history(catalog)
    assert len(whole.savepoints) == 5
    light = load_for_metrics(catalog)
    ages = ("lastCompletedCheckpointAgeSeconds", "heartbeatAgeSeconds")  # read a moment apart
    assert {k: v for k, v in metric_values(light).items() if k not in ages} == \
        {k: v for k, v in metric_values(whole).items() if k not in ages}
    assert light.savepoints == () and light.checkpoints == whole.checkpoints
    report, whole_report = (check_health(light, max_checkpoint_age=600),
                            check_health(whole, max_checkpoint_age=600))
    assert (report.healthy, report.problems) == (whole_report.healthy, whole_report.problems)
