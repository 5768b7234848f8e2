"""A job's input in tests: JSON-lines files, one per micro-batch.

Spark's file source orders files by modification time, so with ``maxFilesPerTrigger=1``
one file is one micro-batch when the mtimes increase with the batch (docs/howto/write-a-job.md).
The keyed-totals oracle (`expected_totals`) and what such a job wrote (`delta_totals`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BASE_MTIME = 1_700_000_000


def write_json_batches(
    directory: Path,
    batches: Iterable[Sequence[Mapping[str, Any]]],
    *,
    start: int = 0,
    name: str = "part-{:05d}.json",
    base_mtime: float = BASE_MTIME,
    mtime_step: float = 1,
) -> list[Path]:
    """Write one file per batch of rows: batch ``start + i`` as ``name.format(start + i)``
    with mtime ``base_mtime + (start + i) * mtime_step``. Each file is written under a
    hidden name and renamed into place, so a running stream never reads half a file.
    Returns the paths, in batch order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, rows in enumerate(batches, start=start):
        path = directory / name.format(index)
        tmp = directory / f".{path.name}.tmp"
        tmp.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
        mtime = base_mtime + index * mtime_step
        os.utime(tmp, (mtime, mtime))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def write_event_files(directory: Path, files: int, users: int, start: int = 0) -> list[dict[str, Any]]:
    """Write `files` JSON files of `users` events each (``{"user", "amount"}``), file
    ``start + i`` as ``events-<start + i>.json`` with increasing mtimes (one file = one
    micro-batch with maxFilesPerTrigger=1). Returns every row written."""
    batches = [[{"user": f"u{u}", "amount": i * 10 + u} for u in range(users)]
               for i in range(start, start + files)]
    write_json_batches(directory, batches, start=start, name="events-{:05d}.json")
    return [row for batch in batches for row in batch]


def write_id_events(directory: Path, files: int, *, start: int = 0, users: int = 3) -> list[dict[str, Any]]:
    """Write `files` JSON files of `users` events each (``{"id", "user", "amount"}``, ids
    unique over all files), file ``start + i`` as ``events-<start + i>.json`` with
    increasing mtimes (one file = one micro-batch with maxFilesPerTrigger=1). Returns
    every row written."""
    batches = [[{"id": i * 1000 + u, "user": f"u{u}", "amount": i * 10 + u + 1} for u in range(users)]
               for i in range(start, start + files)]
    write_json_batches(directory, batches, start=start, name="events-{:05d}.json")
    return [row for batch in batches for row in batch]


def expected_totals(rows: Iterable[Mapping[str, Any]], key: str = "user",
                    value: str = "amount") -> dict[str, tuple[int, int]]:
    """The oracle of a keyed-totals job, in plain Python from its input `rows`: per
    `key`, the sum of `value` and the row count."""
    totals: dict[str, tuple[int, int]] = {}
    for row in rows:
        total, count = totals.get(row[key], (0, 0))
        totals[row[key]] = (total + row[value], count + 1)
    return totals


def delta_totals(path: Path | str) -> dict[str, tuple[int, int]]:
    """What a keyed-totals job wrote to the Delta table at `path`, in `expected_totals`'
    shape: per user, (total, events); one row per user (a duplicate fails the test)."""
    from deltalake import DeltaTable

    got = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert len({r["user"] for r in got}) == len(got), f"duplicate users: {got}"
    return {r["user"]: (r["total"], r["events"]) for r in got}


def sorted_delta_rows(path: Path | str) -> list[dict[str, Any]]:
    """Every row of the Delta table at `path`, in one order that does not depend on how
    the table's files were written (each row's JSON text), for comparing whole tables."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
