"""A file sink's output by hand: a batch staged as Spark's writer leaves it under
``_staging/<txn>`` (`staged_transaction`), and what a reader of the output sees
(`visible`, `visible_rows`)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.sinks.directory import DirectorySink
from tests.support.records import transaction_record

__all__ = ["json_rows", "sink_dir", "staged_transaction", "visible", "visible_rows"]


def sink_dir(sink: DirectorySink) -> Path:
    """The local directory of `sink` (a ``file://`` one)."""
    return Path(sink.uri.removeprefix("file://"))


def staged_transaction(sink: DirectorySink, batch: int, generation: int, *, job: str,
                       files: int = 1) -> TransactionRecord:
    """Batch `batch` of `job`'s generation `generation` staged in `sink` as `files` JSON
    files of one row each (row i: ``{"id": batch * 100 + i, "txn": <txn>}``), and its
    transaction record (not stored)."""
    txn = f"{job}-b{batch}-g{generation}"
    staging = sink_dir(sink) / "_staging" / txn
    staging.mkdir(parents=True)
    described = []
    for i in range(files):
        body = json.dumps({"id": batch * 100 + i, "txn": txn}) + "\n"
        (staging / f"part-{i:05d}.json").write_text(body)
        described.append({"path": f"part-{i:05d}.json", "size": len(body)})
    payload = {"format": "json", "staging": f"_staging/{txn}", "files": described,
               "bytes": sum(f["size"] for f in described)}
    return transaction_record(sink, batch, generation, payload, job=job)


def visible(relative: str) -> bool:
    """Whether a reader of a sink's output sees the file at `relative` (a path or key
    under the output): none of its parts starts with ``_`` or ``.`` (staging, claims,
    Spark's metadata and hidden files)."""
    return not any(part.startswith(("_", ".")) for part in relative.split("/"))


def json_rows(texts: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON-lines rows of `texts`, in order (blank lines skipped)."""
    return [json.loads(line) for text in texts for line in io.StringIO(text) if line.strip()]


def visible_rows(output: Path | DirectorySink, *, order_by: str | None = None) -> list[dict[str, Any]]:
    """The rows of every file under `output` (a directory, or a directory sink's) that a
    reader sees (`visible`), files in path order, or sorted by field `order_by` when
    given; none when the directory does not exist."""
    root = output if isinstance(output, Path) else sink_dir(output)
    files = sorted(root.rglob("*")) if root.exists() else []
    rows = json_rows(p.read_text() for p in files if p.is_file() and visible(str(p.relative_to(root))))
    return rows if order_by is None else sorted(rows, key=lambda r: r[order_by])
