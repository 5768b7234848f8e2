"""What a Delta table shows, read on this machine (``sparkpoint demo`` and the example-DAG
tests): its rows, its commits and which Sparkpoint batches they hold, and the staged
output an aborted or unfinished transaction left behind (`delta_history` and
`orphaned_staged_files` are `services.sinks`', the home of the sinks' commit info and
staging layout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_sparkpoint.services.sinks import delta_history, delta_table_rows, orphaned_staged_files

__all__ = ["delta_commits", "delta_history", "delta_rows", "orphaned_staged_files"]


def delta_rows(path: Path | str, version: int | None = None) -> list[dict[str, Any]]:
    """The table's rows (at `version`, default the latest); ``[]`` when it is no table yet."""
    return delta_table_rows(path, version)


def delta_commits(path: Path | str) -> list[dict[str, Any]]:
    """The table's commits written by Sparkpoint (``job``, ``batch``, ``generation``), in
    batch order."""
    commits = [{"job": e["job"], "batch": e["batch"], "generation": e["generation"]}
               for e in delta_history(path) if e["batch"] is not None]
    return sorted(commits, key=lambda c: c["batch"])
