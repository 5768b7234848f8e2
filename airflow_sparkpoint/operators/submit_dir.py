"""Deprecated alias: the submission directory moved to `airflow_sparkpoint.services.submit_dir`.
This module keeps the former names working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.services.submit_dir import (
    PREFIX,
    ROCKSDB_LIBRARY_DIR_ENV,
    SWEEP_MIN_AGE_S,
    SubmitDir,
    build_runtime_zip,
    open_submit_dir,
    sweep,
)

__all__ = ["PREFIX", "ROCKSDB_LIBRARY_DIR_ENV", "SWEEP_MIN_AGE_S", "SubmitDir", "build_runtime_zip",
           "open_submit_dir", "sweep"]

warnings.warn("airflow_sparkpoint.operators.submit_dir is deprecated: import from "
              "airflow_sparkpoint.services.submit_dir", DeprecationWarning, stacklevel=2)
