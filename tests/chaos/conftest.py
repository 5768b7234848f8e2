"""Chaos fixtures: the moto endpoint as an `S3Context`, and the summary tables of the
crash trials printed at the end of the session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.harness import REPORTS, S3Context, format_report


@pytest.fixture()
def s3_context(s3_server: str, s3_bucket: str) -> S3Context:
    return S3Context(s3_server, s3_bucket)


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
