"""Deprecated alias: the ``sparkpoint`` command's errors are in
`airflow_sparkpoint.exceptions` (`UsageError`, `CommandFailed`) and the command itself
is the package `airflow_sparkpoint.cli`. This module keeps
``airflow_sparkpoint.cli_common.UsageError`` (docs/reference/exceptions.md) working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.exceptions import CommandFailed, UsageError

__all__ = ["CommandFailed", "UsageError"]

warnings.warn("airflow_sparkpoint.cli_common is deprecated: import UsageError and CommandFailed from "
              "airflow_sparkpoint.exceptions", DeprecationWarning, stacklevel=2)
