"""The ``sparkpoint`` command ends through `process_exit.exit_process` (no interpreter
teardown): its output still arrives whole through a pipe, and its exit code is the
command's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COMMAND = "import sys; from airflow_sparkpoint.cli import main; sys.exit(main())"


def sparkpoint(*argv: str) -> subprocess.CompletedProcess[str]:
    # What the console script does; stdout is a pipe, so it is block-buffered until flushed.
    return subprocess.run([sys.executable, "-c", COMMAND, *argv], capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_command_ends_with_its_output_flushed_and_its_exit_code(tmp_path: Path) -> None:
    listed = sparkpoint("list", "--dir", str(tmp_path), "--job", "orders", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["checkpoints"] == []

    bad = sparkpoint("list", "--dir", str(tmp_path))
    assert bad.returncode == 2, (bad.returncode, bad.stderr)
    assert "sparkpoint list: error: --job is required" in bad.stderr


def test_python_dash_m_runs_the_command_too(tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, "-m", "airflow_sparkpoint.cli", "list", "--dir", str(tmp_path),
                             "--job",
                             "orders", "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["savepoints"] == []


def test_the_errors_former_module_is_a_deprecated_alias() -> None:
    """docs/reference/exceptions.md named `airflow_sparkpoint.cli_common.UsageError`."""
    import importlib

    import pytest

    from airflow_sparkpoint import exceptions

    sys.modules.pop("airflow_sparkpoint.cli_common", None)
    with pytest.warns(DeprecationWarning, match="airflow_sparkpoint.exceptions"):
        alias = importlib.import_module("airflow_sparkpoint.cli_common")
    assert alias.UsageError is exceptions.UsageError and alias.CommandFailed is exceptions.CommandFailed
