"""Small helpers shared by tests (input generation and the expected results)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.support.inputs import write_json_batches


def write_event_files(directory: Path, files: int, users: int, start: int = 0) -> list[dict]:
    """Write `files` JSON files of `users` events each, with increasing modification
    times (Spark's file source orders by mtime, so one file = one micro-batch with
    maxFilesPerTrigger=1). Returns every row written."""
    batches = [[{"user": f"u{u}", "amount": i * 10 + u} for u in range(users)] for i in range(start, start + files)]
    write_json_batches(directory, batches, start=start, name="events-{:05d}.json")
    return [row for batch in batches for row in batch]


def expected_totals(rows: Iterable[dict]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for row in rows:
        total, events = totals.get(row["user"], (0, 0))
        totals[row["user"]] = (total + row["amount"], events + 1)
    return totals
