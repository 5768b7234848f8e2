"""Deprecated alias of `airflow_sparkpoint.checkpoints.snapshot_open` (opening a snapshot by
URI or path): this module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.checkpoints.snapshot_open import (
    open_restart_snapshot,
    open_snapshot,
    read_metadata,
    restored_by,
    snapshot_at,
    stored_sizes,
)

__all__ = [
    "open_restart_snapshot", "open_snapshot", "read_metadata", "restored_by", "snapshot_at", "stored_sizes",
]

warnings.warn("airflow_sparkpoint.checkpoints.targets is deprecated: import from "
              "airflow_sparkpoint.checkpoints.snapshot_open", DeprecationWarning, stacklevel=2)
