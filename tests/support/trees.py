"""What a directory tree holds, to prove that an action wrote or changed nothing in it."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["tree_digest"]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` (its path relative to `root`) with its sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
