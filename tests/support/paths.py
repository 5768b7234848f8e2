"""Where the repository is, for tests that read its files or run its scripts, and a
file of it loaded as a module (`load_module`: scripts and job files are no package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

#: the repository's root (``dags/``, ``pyproject.toml``, ``scripts/``)
REPO = Path(__file__).resolve().parents[2]


def load_module(name: str, path: Path | str) -> ModuleType:
    """The Python file at `path` executed as a fresh module named `name` (not put in
    ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
