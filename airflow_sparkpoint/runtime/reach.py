"""Deprecated alias of `airflow_sparkpoint.runtime.executor_reach` (the check that executors
reach the live location): this module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.runtime.executor_reach import (
    DEFAULT_WAIT_S,
    DRIVER_FILE,
    PROBE_PREFIX,
    SPARK_WAIT_KEY,
    Executor,
    check_executors_reach,
    executors,
    wait_seconds,
)

__all__ = [
    "DEFAULT_WAIT_S", "DRIVER_FILE", "PROBE_PREFIX", "SPARK_WAIT_KEY", "Executor",
    "check_executors_reach", "executors", "wait_seconds",
]

warnings.warn("airflow_sparkpoint.runtime.reach is deprecated: import from "
              "airflow_sparkpoint.runtime.executor_reach", DeprecationWarning, stacklevel=2)
