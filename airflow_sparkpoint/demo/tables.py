"""What a Delta table shows, read on this machine (``sparkpoint demo`` and the example-DAG
tests): its rows, its commits and which Sparkpoint batches they hold, and the staged
output an aborted or unfinished transaction left behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_sparkpoint.services.sinks import delta_table_rows

__all__ = ["delta_commits", "delta_history", "delta_rows", "orphaned_staged_files"]


def delta_rows(path: Path | str, version: int | None = None) -> list[dict[str, Any]]:
    """The table's rows (at `version`, default the latest); ``[]`` when it is no table yet."""
    return delta_table_rows(path, version)


def delta_history(path: Path | str) -> list[dict[str, Any]]:
    """Every commit of the table, oldest first: ``version``, ``operation``, ``timestamp``
    (ms) and, for Sparkpoint's commits, ``job``, ``batch`` and ``generation`` (else None)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return []
    history = []
    for entry in DeltaTable(str(path)).history():
        batch = entry.get("sparkpoint.batch")
        history.append({
            "version": int(entry["version"]),
            "operation": str(entry.get("operation", "")),
            "timestamp": entry.get("timestamp"),
            "job": entry.get("sparkpoint.job"),
            "batch": int(batch) if batch is not None else None,
            "generation": int(entry["sparkpoint.generation"]) if "sparkpoint.generation" in entry else None,
        })
    return sorted(history, key=lambda e: e["version"])


def delta_commits(path: Path | str) -> list[dict[str, Any]]:
    """The table's commits written by Sparkpoint (``job``, ``batch``, ``generation``), in
    batch order."""
    commits = [{"job": e["job"], "batch": e["batch"], "generation": e["generation"]}
               for e in delta_history(path) if e["batch"] is not None]
    return sorted(commits, key=lambda c: c["batch"])


def orphaned_staged_files(table: Path | str, job: str) -> list[str]:
    """Staged parquet files that are not part of the table: output of an aborted or
    unfinished transaction left behind. (Committed appends keep their staged files: the
    Delta commit adds them in place, without a copy.)"""
    from deltalake import DeltaTable

    staging = Path(table) / "_sparkpoint_txn" / job
    staged = {str(p) for p in staging.rglob("*.parquet")} if staging.exists() else set()
    if staged and DeltaTable.is_deltatable(str(table)):
        staged -= {str(Path(uri)) for uri in DeltaTable(str(table)).file_uris()}
    return sorted(staged)
