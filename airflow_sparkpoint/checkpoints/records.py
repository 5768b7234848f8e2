"""Deprecated alias of `airflow_sparkpoint.checkpoints.history_records` (the records of the
history read model): this module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.checkpoints.history_records import (
    AIRFLOW_CONTEXT_ENV,
    CONFIG_FIELDS,
    GENERATIONS_SHOWN,
    AirflowTry,
    ControlRecord,
    GenerationRecord,
    SnapshotRecord,
    StagedRecord,
    airflow_context,
    generation_details,
    generation_records,
    iso,
    open_requests,
    plan_origin,
    read_generation,
    short_name,
    snapshot_records,
    staged_transactions,
)

__all__ = [
    "AIRFLOW_CONTEXT_ENV", "CONFIG_FIELDS", "GENERATIONS_SHOWN", "AirflowTry", "ControlRecord",
    "GenerationRecord", "SnapshotRecord", "StagedRecord", "airflow_context", "generation_details",
    "generation_records", "iso", "open_requests", "plan_origin", "read_generation", "short_name",
    "snapshot_records", "staged_transactions",
]

warnings.warn("airflow_sparkpoint.checkpoints.records is deprecated: import from "
              "airflow_sparkpoint.checkpoints.history_records", DeprecationWarning, stacklevel=2)
