"""The shadow tests' job (`tests/integration/jobs/shadow_totals.py`: per-user totals from a
JSON file source, one file per batch), its input and a plain-Python oracle."""

from __future__ import annotations

from typing import Any

from tests.support.paths import REPO, load_module

__all__ = ["FILES", "JOB_SCRIPT", "job_module", "oracle", "rows_of"]

JOB_SCRIPT = REPO / "tests" / "integration" / "jobs" / "shadow_totals.py"
FILES = [("u0", "u1"), ("u1", "u2"), ("u0", "u2", "u3"), ("u3",), ("u1", "u4"), ("u0", "u4")]


def job_module() -> Any:
    """The job script as a module (its query, for green in this process)."""
    return load_module("shadow_totals", JOB_SCRIPT)


def rows_of(index: int, users: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"user": u, "amount": index * 10 + int(u[1:]) + 1} for u in users]


def oracle(files: list[tuple[str, ...]]) -> dict[str, tuple[int, int]]:
    """(total, events) by user, in plain Python from the input."""
    totals: dict[str, tuple[int, int]] = {}
    for index, users in enumerate(files):
        for row in rows_of(index, users):
            total, events = totals.get(row["user"], (0, 0))
            totals[row["user"]] = (total + row["amount"], events + 1)
    return totals
