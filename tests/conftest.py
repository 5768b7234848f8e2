"""Shared fixtures: a fresh moto bucket, an Airflow home.

The servers (SparkSession, moto, SeaweedFS) are package-scoped fixtures that each test
package declares in its conftest.py (`tests.support.servers.package_fixtures`), so each stops
when its package is done.

Markers: unmarked tests are fast unit tests; ``spark``, ``s3`` and ``airflow`` tests
need real components; ``slow`` ones are left out of the default run.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

# Spark's Python workers must run the interpreter of the driver (the venv's).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# boto3 must never reach a real AWS account from a test.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)


@pytest.fixture()
def s3_bucket(s3_server: str) -> str:
    """A fresh, empty bucket on the moto endpoint; returns its name."""
    import boto3

    name = f"sp-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


#: set by `airflow_home` beside Airflow's settings (a home set by anything else is not the test home)
AIRFLOW_HOME_MARK = "SPARKPOINT_TEST_AIRFLOW_HOME"


# Session-scoped, unlike the servers: it sets AIRFLOW_* in this process before Airflow is
# first imported, and Airflow reads its configuration once per process.
@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An AIRFLOW_HOME under a temp dir with a migrated SQLite metadata database.

    The environment is set before Airflow is first imported in this process; the DAGs
    folder is the repository's ``dags/``.
    """
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        AIRFLOW_HOME_MARK: "1",
    }
    os.environ.update(env)
    from airflow.utils import db

    db.resetdb()
    yield home


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that imports Airflow into this process before `airflow_home` set its home
    fails here, named: Airflow reads its settings once, so every later in-process Airflow
    test of the run would otherwise fail on the default home, far from the cause."""
    before = "airflow.settings" in sys.modules
    yield
    if not before and "airflow.settings" in sys.modules and AIRFLOW_HOME_MARK not in os.environ:
        pytest.fail(f"{item.nodeid} imported Airflow into the test process before the airflow_home "
                    "fixture set its home: request airflow_home first", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """On PySpark 3.5 (the oldest line of `make test-matrix`), py4j 0.10.9.7 leaves its
    callback sockets to the garbage collector: an unraisable ResourceWarning at some later
    test, not this project's leak. Ignored on that line only."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return
    if version.startswith("3.5."):
        config.addinivalue_line(
            "filterwarnings",
            "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.spark_feature(name)``: a test of a feature of the runtime's feature
    table (`runtime.spark_support.FEATURES`) is skipped on a Spark line older than the
    feature's minimum, where the runtime refuses it (unit-tested in
    tests/unit/runtime/test_spark_support.py); the reason names both (docs/compatibility.md)."""
    marker = item.get_closest_marker("spark_feature")
    if marker is None:
        return
    import importlib.metadata

    from airflow_sparkpoint.runtime.spark_support import FEATURES, spark_line

    feature = FEATURES[marker.args[0]]
    version = importlib.metadata.version("pyspark")
    if spark_line(version) < feature.min_version:
        pytest.skip(f"refused on Spark {version}: {feature.name} needs Spark >= {feature.min_text}")


@pytest.fixture(autouse=True)
def _no_task_context_left() -> Iterator[None]:
    """dag.test() exports its task's ``AIRFLOW_CTX_*`` into this process's environment and
    leaves them there: a driver a later test starts would record itself as started by that
    task (and a takeover check would then see another task's run)."""
    yield
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CTX_")]:
        del os.environ[name]
