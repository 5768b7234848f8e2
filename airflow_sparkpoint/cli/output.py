"""What the ``sparkpoint`` commands print: exit codes, text tables and pairs, one JSON
document (shapes: docs/CLI.md), times and sizes as the records show them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sparkpoint.services.history import iso, size

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "emit_json", "iso", "listing", "pairs", "size", "table"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: frozenset[int] = frozenset()) -> str:
    """Left-aligned text columns, right-aligned number columns (indices in `right`)."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def pairs(items: Sequence[tuple[str, Any]]) -> str:
    """``key  value`` lines, the keys padded to one width; None shows as ``-``."""
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in items)


def listing(value: Any) -> Any:
    """Lists as ``2: a, b`` (``0`` when empty); anything else unchanged."""
    if isinstance(value, (list, tuple)):
        return f"{len(value)}: {', '.join(map(str, value))}" if value else "0"
    return value


def emit_json(document: Mapping[str, Any]) -> None:
    """Print `document` as the command's one JSON document."""
    print(json.dumps(document, indent=2, sort_keys=True, default=str))
