"""Chaos fixtures: a fresh bucket per test on each of the two S3 servers (moto in a child
process, SeaweedFS: both servers from ``tests/support/servers.py``, up while this package runs), and the
summary tables of the crash trials printed at the end of the session (and appended to the
cumulative record when ``SPARKPOINT_CHAOS_RECORD`` names it: `tests.chaos.record`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import record
from tests.chaos.plan import REPORTS, format_report
from tests.support.s3_servers import S3Context, new_bucket
from tests.support.servers import package_fixtures

#: this session's name in the record: taken at the start, before any commit made meanwhile
RUN = record.run_id()

spark, s3_server, s3_server_process, seaweedfs_server = package_fixtures(
    "spark", "s3_server", "s3_server_process", "seaweedfs_server")


@pytest.fixture()
def s3_context(s3_server_process: str) -> S3Context:
    """A fresh bucket on moto in a child process: the checks read Delta tables on S3
    with delta-rs from this process (see `s3_server_process`)."""
    return new_bucket(s3_server_process, "moto")


@pytest.fixture()
def s3_servers(s3_server_process: str, seaweedfs_server: str) -> dict[str, S3Context]:
    """A fresh bucket on each S3 server, by server name (`tests.support.s3_servers.SERVERS`)."""
    return {"moto": new_bucket(s3_server_process, "moto"),
            "seaweedfs": new_bucket(seaweedfs_server, "seaweedfs")}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORTS:
        return
    terminalreporter.section("sparkpoint chaos trials")
    for title, results, seed in REPORTS:
        terminalreporter.write_line(format_report(title, results, seed))
        terminalreporter.write_line("")
    if os.environ.get(record.ENV):  # make chaos: the cumulative record (docs/chaos/)
        path = Path(os.environ[record.ENV])
        count = record.append(path, REPORTS, RUN)
        terminalreporter.write_line(f"appended {count} trials to {path}; table: {record.write_table(path)}")
