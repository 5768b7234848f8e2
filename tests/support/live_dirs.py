"""Hand-made live checkpoint directories: the files Spark's streaming query would have
written, for tests of the checkpointer without Spark."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_live"]


def write_live(root: Path, batch: int) -> None:
    """Files Spark would have after batch `batch` (RocksDB changelog layout)."""
    (root / "metadata").parent.mkdir(parents=True, exist_ok=True)
    if not (root / "metadata").exists():
        (root / "metadata").write_text('{"id":"q"}')
    for name, text in ((f"offsets/{batch}", f"o{batch}"), (f"commits/{batch}", f"c{batch}"),
                       (f"state/0/0/{batch + 1}.changelog", "s" * 1000 * (batch + 1))):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
