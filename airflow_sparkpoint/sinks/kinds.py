"""Deprecated alias of `airflow_sparkpoint.sinks.registry` (the registry of sink kinds): this
module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.sinks.registry import (
    BUILT_IN,
    sink_from_config,
)

__all__ = [
    "BUILT_IN", "sink_from_config",
]

warnings.warn("airflow_sparkpoint.sinks.kinds is deprecated: import from "
              "airflow_sparkpoint.sinks.registry", DeprecationWarning, stacklevel=2)
