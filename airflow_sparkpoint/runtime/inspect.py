"""Deprecated alias of `airflow_sparkpoint.runtime.state_inspect` (it shadowed the standard
library's inspect): this module keeps the former import path working."""

from __future__ import annotations

import warnings

from airflow_sparkpoint.runtime.state_inspect import (
    OperatorSpec,
    OperatorState,
    SnapshotReader,
    SnapshotState,
    StoreSpec,
    StoreState,
    first_line,
    inspect_snapshot,
    key_filter,
    local_session,
    open_state,
    read_operator_specs,
    read_store,
    resolve_snapshot,
    rows_as_json,
    sql_type,
    state_rows,
)

__all__ = [
    "OperatorSpec", "OperatorState", "SnapshotReader", "SnapshotState", "StoreSpec", "StoreState",
    "first_line", "inspect_snapshot", "key_filter", "local_session", "open_state",
    "read_operator_specs", "read_store", "resolve_snapshot", "rows_as_json", "sql_type",
    "state_rows",
]

warnings.warn("airflow_sparkpoint.runtime.inspect is deprecated: import from "
              "airflow_sparkpoint.runtime.state_inspect", DeprecationWarning, stacklevel=2)
