"""Deprecated alias: the commit step is the service `airflow_sparkpoint.services.commit`.
This module keeps ``airflow_sparkpoint.sinks.commit.commit_pending`` (named in earlier
releases' docs/CLI.md) and `Sinks` working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.services.commit import Sinks, commit_pending

__all__ = ["Sinks", "commit_pending"]

warnings.warn("airflow_sparkpoint.sinks.commit is deprecated: import commit_pending from "
              "airflow_sparkpoint.services.commit", DeprecationWarning, stacklevel=2)
