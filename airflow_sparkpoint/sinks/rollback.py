"""Deprecated alias: the rollback is the service `airflow_sparkpoint.services.rollback`.
This module keeps ``airflow_sparkpoint.sinks.rollback.abort_generation`` and
`abort_stopped_generation` working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.services.rollback import abort_generation, abort_stopped_generation

__all__ = ["abort_generation", "abort_stopped_generation"]

warnings.warn("airflow_sparkpoint.sinks.rollback is deprecated: import abort_generation and "
              "abort_stopped_generation from airflow_sparkpoint.services.rollback", DeprecationWarning,
              stacklevel=2)
