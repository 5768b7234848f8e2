"""The demo's record: generation switches, checkpoint history, savepoints, the checkpoint
summary and the Delta table history, as plain-text tables. Every figure comes from the
history model (`airflow_sparkpoint.services.history`); this module only lays them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from airflow_sparkpoint.services.history import (
    GenerationRecord,
    PipelineHistory,
    SnapshotRecord,
    generation_records,
    plan_origin,
    short_name,
    snapshot_records,
)
from airflow_sparkpoint.services.history import size as display_size

__all__ = [
    "checkpoint_table", "delta_history_table", "format_table", "generation_table", "human_bytes", "origin",
    "savepoint_table", "short_name", "snapshot_key", "summary_lines",
]


def origin(plan: str | None) -> str:
    """What a generation started from, short, from its restore plan's description:
    ``empty state``, ``chk-4``, ``savepoint-1-x1y2``, ``-``."""
    return GenerationRecord(0, plan=plan, restored_from=plan_origin(plan)).origin


def human_bytes(size: float) -> str:
    """``512 B``, ``1.4 KiB``, ``3.0 MiB`` ... (`services.history.size`)."""
    return display_size(size)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "   ") -> list[str]:
    """Lines of a plain-text table: numbers right-aligned, everything else left-aligned,
    ``None`` shown as ``-``; a dashed rule under the header.

    :raises ValueError: a row has a different number of cells than `headers`.
    """
    cells: list[list[str]] = []
    numeric = [True] * len(headers)
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"table row {list(row)!r} has {len(row)} cells; expected "
                             f"{len(headers)} ({headers})")
        cells.append(["-" if v is None else str(v) for v in row])
        for i, value in enumerate(row):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                numeric[i] = False
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(list(headers)), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def generation_table(catalog: Any, role: Callable[[int], str], last_states: Mapping[tuple[str, int], str],
                     t0: float) -> list[str]:
    """Every generation of the job: its role, when it started (seconds after `t0`), what it
    restored, how it ended (its run result, else the last state the watcher saw) and the
    Airflow task try that started it."""
    rows = []
    current = catalog.current_generation()
    for record in reversed(generation_records(catalog, limit=current, current=current)):
        result = record.result
        if result is not None and result.status:
            outcome = f"{result.status}, batches {result.first_batch}..{result.last_batch}"
            if result.committed_batches:
                outcome += f", committed {list(result.committed_batches)}"
        else:  # a generation that failed, or died (SIGKILL) with its status still "running"
            state = last_states.get((catalog.job, record.generation)) or \
                (record.outcome if record.outcome not in ("superseded", "unknown") else None)
            outcome = ("failed" if state == "failed" else f"died while {state}" if state else "died") + \
                ", no run result"
        started = record.started_at
        rows.append((record.generation, role(record.generation), f"+{started - t0:.0f}s" if started else None,
                     record.origin, outcome, record.airflow.describe() if record.airflow else None))
    return format_table(["gen", "role", "started", "restored from", "outcome", "started by"], rows)


def snapshot_key(record: Any) -> tuple[int, int, int]:
    """What identifies a checkpoint over a job's history: (id, generation, batch)."""
    return (record.id, record.generation, record.batch_id)


def checkpoint_table(observed: Iterable[SnapshotRecord], retained: Iterable[SnapshotRecord],
                     role: Callable[[int], str]) -> list[str]:
    """Checkpoints (valid `SnapshotRecord`s), oldest first: batch, generation, duration,
    bytes copied (incremental) and total, and whether retention still keeps them
    (`retained`: the store's current checkpoints)."""
    keep = {snapshot_key(r) for r in retained if r.valid}
    rows = [(r.id, r.batch_id, r.generation, role(r.generation or 0), r.duration_ms,
             human_bytes(r.bytes_copied or 0), human_bytes(r.bytes_total or 0), r.file_count,
             "retained" if snapshot_key(r) in keep else "retired")
            for r in sorted(observed, key=lambda r: (r.created_at or 0.0, r.id)) if r.valid]
    return format_table(["chk", "batch", "gen", "role", "ms", "copied", "total", "files", "now"], rows)


def summary_lines(history: PipelineHistory) -> list[str]:
    """Flink's checkpoint counts and the min/avg/max over the retained checkpoints."""
    counts = history.counts
    scope = "ever" if counts.lifetime else "retained"
    lines = [(f"   checkpoints {scope}: {counts.completed} completed, {counts.failed} failed, "
             f"{counts.restored} restores")]
    for label, stat, show in (("duration", history.duration_ms, lambda v: f"{v:.0f} ms"),
                              ("copied", history.bytes_copied, human_bytes),
                              ("total", history.bytes_total, human_bytes)):
        if stat is not None:
            lines.append(f"   {label} over the {len(history.completed)} retained: min {show(stat.min)}, "
                         f"avg {show(stat.avg)}, max {show(stat.max)}")
    return lines


def savepoint_table(catalog: Any, role: Callable[[int], str], t0: float) -> list[str]:
    """The job's valid savepoints, oldest first."""
    rows = [(short_name(r.uri), r.batch_id, r.generation, role(r.generation or 0),
             f"+{(r.created_at or t0) - t0:.0f}s", human_bytes(r.bytes_total or 0), r.file_count)
            for r in reversed(snapshot_records(catalog, "savepoint", drills=False)) if r.valid]
    return format_table(["savepoint", "batch", "gen", "role", "taken", "size", "files"], rows)


def delta_history_table(history: Iterable[Mapping[str, Any]], role: Callable[[int], str]) -> list[str]:
    """`demo.support.delta_history` entries: version, operation and Sparkpoint's commit info."""
    rows = [(e["version"], e["operation"], e["job"], e["batch"], e["generation"],
             None if e["generation"] is None else role(e["generation"]))
            for e in history]
    return format_table(["version", "operation", "sparkpoint.job", "batch", "generation", "role"], rows)
