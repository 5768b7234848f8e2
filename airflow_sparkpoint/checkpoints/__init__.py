"""The checkpoint catalog: metadata model, layout, retention, savepoints, generations.

Pure Python: imports neither Spark nor Airflow.
"""

from __future__ import annotations

from airflow_sparkpoint.checkpoints.catalog import Catalog, open_snapshot
from airflow_sparkpoint.checkpoints.catalog_types import (
    GenerationInfo,
    RetentionResult,
    SnapshotEntry,
    SnapshotHandle,
)
from airflow_sparkpoint.checkpoints.metadata import (
    FileRef,
    SnapshotMetadata,
    SnapshotStats,
    TransactionRecord,
)

__all__ = [
    "Catalog",
    "FileRef",
    "GenerationInfo",
    "RetentionResult",
    "SnapshotEntry",
    "SnapshotHandle",
    "SnapshotMetadata",
    "SnapshotStats",
    "TransactionRecord",
    "open_snapshot",
]
