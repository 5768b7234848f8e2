"""Deprecated alias of `airflow_sparkpoint.checkpoints.catalog_types` (the types the catalog
hands out): this module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.checkpoints.catalog_types import (
    GenerationInfo,
    RetentionResult,
    SnapshotEntry,
    SnapshotHandle,
    SnapshotSummary,
    claim_details,
)

__all__ = [
    "GenerationInfo", "RetentionResult", "SnapshotEntry", "SnapshotHandle", "SnapshotSummary",
    "claim_details",
]

warnings.warn("airflow_sparkpoint.checkpoints.entries is deprecated: import from "
              "airflow_sparkpoint.checkpoints.catalog_types", DeprecationWarning, stacklevel=2)
