"""The shadow tests' job (`tests/integration/jobs/shadow_totals.py`: per-user totals from a
JSON file source, one file per batch), its input and a plain-Python oracle."""

from __future__ import annotations

from typing import Any

from tests.support.paths import REPO, load_module

__all__ = ["FILES", "JOB_SCRIPT", "batch_rows", "green_totals", "job_module", "oracle", "rows_of",
           "version_rows"]

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


def green_totals(files: list[tuple[str, ...]], k: int) -> list[dict[str, tuple[int, int]]]:
    """(total, events) by user after each batch, for the batch's users: blue's sums
    through batch `k`, green's doubled amounts after it (`k` = -1: green's code from the
    start, `k` >= the last batch: blue's code throughout)."""
    totals: dict[str, tuple[int, int]] = {}
    after: list[dict[str, tuple[int, int]]] = []
    for index, users in enumerate(files):
        for row in rows_of(index, users):
            total, events = totals.get(row["user"], (0, 0))
            totals[row["user"]] = (total + row["amount"] * (2 if index > k else 1), events + 1)
        after.append({u: totals[u] for u in users})
    return after


def version_rows(table: Any, version: int) -> list[dict[str, Any]]:
    """The rows version `version` of an append-only Delta table (a `DeltaTable`) added."""
    import pyarrow.parquet as pq

    table.load_as_version(version)
    after = set(table.file_uris())
    before: set[str] = set()
    if version > 0:  # version 0 created the table with its first batch
        table.load_as_version(version - 1)
        before = set(table.file_uris())
    return [row for uri in sorted(after - before)
            for row in pq.read_table(uri.removeprefix("file://")).to_pylist()]


def batch_rows(path: Any, commits: list[dict[str, Any]]) -> dict[int, dict[str, tuple[int, int]]]:
    """(total, events) by user that each of `commits` (`delta_history` entries of
    Sparkpoint's commits) added to the totals table at `path`, by batch."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    return {int(c["batch"]): {r["user"]: (r["total"], r["events"])
                              for r in version_rows(table, int(c["version"]))}
            for c in commits}
