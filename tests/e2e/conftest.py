"""Fixtures of the end-to-end suite: one real Airflow stack and one Spark standalone
cluster for this package (each started by the first test that needs it, stopped
after the package's last test).

On a failure, the stack's process logs and task logs (and the cluster's logs) are copied
to ``$SPARKPOINT_E2E_ARTIFACTS`` (default ``test-artifacts/e2e-<time>/`` in the
repository) and the path is printed at the end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import SparkCluster, spark_home
from tests.e2e.stack import VENV_BIN, AirflowApi, AirflowStack
from tests.support.totals_pipeline import E2E_DAGS, FAKES, REPO

TIMINGS: dict[str, float] = {}
SPARK_DEFAULTS = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN",
                  "spark.driver.host": "127.0.0.1"}
ARTIFACTS: list[Path] = []


def _artifacts_dir() -> Path:
    configured = os.environ.get("SPARKPOINT_E2E_ARTIFACTS")
    base = Path(configured) if configured else REPO / "test-artifacts"
    return base / time.strftime("e2e-%Y%m%d-%H%M%S")


@pytest.fixture(scope="package")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[AirflowStack]:
    """api-server, scheduler (LocalExecutor), dag-processor and triggerer on loopback,
    with the e2e DAGs and the example DAGs (``dags/``) as two bundles; ``spark_default``
    is ``local[2]``."""
    home = tmp_path_factory.mktemp("e2e-airflow")
    # What a cluster's spark-defaults.conf would say (the example DAGs pass no Spark conf
    # of their own): small shuffles, no UI, loopback.
    spark_conf = home / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items()))
    stack = AirflowStack(
        home=home,
        bundles={"e2e": E2E_DAGS, "examples": REPO / "dags"},
        extra_env={
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            # The example DAGs' storage: one root for the whole package (jobs have unique names).
            "AIRFLOW_CONN_SPARKPOINT_DEFAULT": json.dumps({"conn_type": "sparkpoint",
                                                           "host": str(home / "sparkpoint")}),
            "SPARK_CONF_DIR": str(spark_conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(spark_home()),
            # The fake cluster manager's spark2-submit comes last: nothing real is shadowed.
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", os.defpath), str(FAKES)]),
            "SPARKPOINT_E2E_LOGS": str(home / "e2e-logs"),
        },
    )
    failed_before = request.session.testsfailed
    try:
        stack.start()
        TIMINGS["Airflow stack start-up (db migrate + 4 processes healthy)"] = stack.started_in
        yield stack
    finally:
        t0 = time.monotonic()
        stack.stop()
        TIMINGS["Airflow stack teardown"] = time.monotonic() - t0
        if request.session.testsfailed > failed_before or not stack.started_in:
            target = _artifacts_dir()
            stack.keep_logs(target / "airflow")
            if (home / "e2e-logs").exists():
                shutil.copytree(home / "e2e-logs", target / "e2e-logs", dirs_exist_ok=True)
            ARTIFACTS.append(target)


@pytest.fixture(scope="package")
def airflow_api(airflow_stack: AirflowStack) -> Iterator[AirflowApi]:
    api = airflow_stack.api()
    yield api
    api.close()


@pytest.fixture(scope="package")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[SparkCluster]:
    """A standalone master and two workers (1 core, 1 GiB each) on loopback."""
    cluster = SparkCluster(base=tmp_path_factory.mktemp("e2e-spark-cluster"))
    failed_before = request.session.testsfailed
    try:
        cluster.start()
        TIMINGS["Spark standalone cluster start-up (master + 2 workers alive)"] = cluster.started_in
        yield cluster
    finally:
        cluster.stop()
        if request.session.testsfailed > failed_before or not cluster.started_in:
            target = _artifacts_dir()
            shutil.copytree(cluster.base / "logs", target / "spark-cluster", dirs_exist_ok=True)
            for work in cluster.base.glob("worker-*"):
                shutil.copytree(work, target / "spark-cluster" / work.name, dirs_exist_ok=True)
            ARTIFACTS.append(target)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS and not ARTIFACTS:
        return
    terminalreporter.section("sparkpoint end-to-end stack")
    for what, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{what}: {seconds:.1f} s")
    for path in ARTIFACTS:
        terminalreporter.write_line(f"logs kept after a failure: {path}")
