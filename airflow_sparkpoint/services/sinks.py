"""A job's sink as the front ends name it: a declaration (`SinkSpec`: a `Sink`, or its
config mapping with ``kind``) checked where it is given (a DAG is parsed, a command
line is read: `parse_sink_arg`, here since the sinks parse no command line), and what
readers see in a Delta table. Which sink settles a transaction
record is `sinks.resolve`'s rule; the front ends only declare. Pure Python: no Spark, no
Airflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.resolve import SinkSpec, declared_sink

__all__ = ["Sink", "SinkSpec", "declared_sink", "delta_table_rows", "parse_sink_arg"]


def parse_sink_arg(text: str, options: Sequence[str] = ()) -> dict[str, Any]:
    """The sink mapping of ``sparkpoint commit --sink KIND:URI [--sink-option KEY=VALUE ...]``.

    Values of ``keys`` and ``partition_by`` are comma-separated lists.

    :raises ConfigError: `text` is not ``KIND:URI`` or an option is not ``KEY=VALUE``.
    """
    kind, sep, uri = text.partition(":")
    if not sep or not kind or not uri:
        raise ConfigError(f"--sink {text!r} is invalid; expected KIND:URI, e.g. delta:s3://bucket/table")
    spec: dict[str, Any] = {"kind": kind, "uri": uri}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ConfigError(f"--sink-option {option!r} is invalid; expected KEY=VALUE, e.g. mode=merge")
        spec[key] = [v for v in value.split(",") if v] if key in ("keys", "partition_by") else value
    return spec


def delta_table_rows(path: Path | str, version: int | None = None,
                     columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The rows readers see in the local Delta table at `path` (at `version`, default the
    latest; `columns` only when given); ``[]`` when it is no table yet. Needs deltalake."""
    from deltalake import DeltaTable

    from airflow_sparkpoint.sinks.delta_rows import read_table

    if not DeltaTable.is_deltatable(str(path)):
        return []
    return list(read_table(DeltaTable(str(path), version=version), columns).to_pylist())
