"""Small helpers shared by tests (input generation and the expected results)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

BASE_MTIME = 1_700_000_000


def write_event_files(directory: Path, files: int, users: int, start: int = 0) -> list[dict]:
    """Write `files` JSON files of `users` events each, with increasing modification
    times (Spark's file source orders by mtime, so one file = one micro-batch with
    maxFilesPerTrigger=1). Returns every row written."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(start, start + files):
        path = directory / f"events-{i:05d}.json"
        batch = [{"user": f"u{u}", "amount": i * 10 + u} for u in range(users)]
        path.write_text("".join(json.dumps(r) + "\n" for r in batch))
        os.utime(path, (BASE_MTIME + i, BASE_MTIME + i))
        rows.extend(batch)
    return rows


def expected_totals(rows: Iterable[dict]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for row in rows:
        total, events = totals.get(row["user"], (0, 0))
        totals[row["user"]] = (total + row["amount"], events + 1)
    return totals
