"""How records, commands and pages show a time (``2026-11-22T00:24:21Z``, UTC) and a
size (``512 B``, ``1.4 KiB``): one format for the CLI, the UI, the demo and messages."""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["iso", "size"]


def iso(epoch: float | None) -> str | None:
    """``2026-11-22T00:24:21Z`` (UTC) of seconds since the epoch, or None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def size(n: float | None) -> str:
    """``512 B``, ``1.4 KiB``, ``3.0 MiB`` ... up to TiB; ``-`` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
