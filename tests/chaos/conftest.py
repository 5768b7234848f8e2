"""Chaos fixtures: the moto endpoint as an `S3Context`, and the summary tables of the
crash trials printed at the end of the session."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.chaos.harness import REPORTS, S3Context, format_report


@pytest.fixture()
def s3_context(s3_server_process: str) -> S3Context:
    """A fresh bucket on moto in a child process: the checks read Delta tables on S3
    with delta-rs from this process (see `s3_server_process`)."""
    import boto3

    name = f"sp-chaos-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server_process, region_name="us-east-1").create_bucket(Bucket=name)
    return S3Context(s3_server_process, name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORTS:
        return
    terminalreporter.section("sparkpoint chaos trials")
    for title, results, seed in REPORTS:
        terminalreporter.write_line(format_report(title, results, seed))
        terminalreporter.write_line("")
    full = [(results, seed) for title, results, seed in REPORTS if title.startswith("chaos trials:")]
    if len(full) > 1:
        combined = [r for results, _seed in full for r in results]
        terminalreporter.write_line(format_report("chaos trials, all sinks", combined, full[0][1]))
