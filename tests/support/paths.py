"""Where the repository is, for tests that read its files or run its scripts."""

from __future__ import annotations

from pathlib import Path

#: the repository's root (``dags/``, ``pyproject.toml``, ``scripts/``)
REPO = Path(__file__).resolve().parents[2]
