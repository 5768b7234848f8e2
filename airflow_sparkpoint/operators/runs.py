"""Deprecated alias: which run is whose moved to `airflow_sparkpoint.services.runs`, the
task's record across tries to `services.retry`, the starter's environment to
`services.submit` and `signal_tree` to `services.processes`. This module keeps the former
names working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.services.processes import signal_tree
from airflow_sparkpoint.services.retry import TASK_STATE_KEY, TaskRecord
from airflow_sparkpoint.services.runs import (
    RunWatcher,
    claim_json,
    find_claim,
    new_token,
    read_result,
    reported_error,
    run_status,
    task_try,
)
from airflow_sparkpoint.services.submit import starter_environment

__all__ = [
    "TASK_STATE_KEY", "RunWatcher", "TaskRecord", "claim_json", "find_claim", "new_token", "read_result",
    "reported_error", "run_status", "signal_tree", "starter_environment", "task_try",
]

warnings.warn("airflow_sparkpoint.operators.runs is deprecated: import from airflow_sparkpoint.services.runs "
              "(and services.retry, services.submit, services.processes)", DeprecationWarning, stacklevel=2)
