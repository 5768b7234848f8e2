"""A job's sink as the front ends name it: a declaration (`SinkSpec`: a `Sink`, or its
config mapping with ``kind``) checked where it is given (a DAG is parsed, a command
line is read: `parse_sink_arg`, here since the sinks parse no command line), and what
its output holds: the transactions not settled yet and the rows they staged (what a
write-audit-publish audit checks: `pending_transactions`, `staged_rows`), and what
readers see in a Delta table (`delta_rows` on any store, with its storage options;
`delta_table_rows` on a local one, at a version), which batches its commits hold
(`delta_history`) and the staged files no commit took (`orphaned_staged_files`). Which
sink settles a transaction record is `sinks.resolve`'s rule; the front ends only
declare. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.resolve import SinkSpec, declared_sink

__all__ = ["Sink", "SinkSpec", "declared_sink", "delta_history", "delta_rows", "delta_table_rows",
           "orphaned_staged_files", "parse_sink_arg", "pending_transactions", "staged_rows"]


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


def delta_history(path: Path | str) -> list[dict[str, Any]]:
    """Every commit of the local Delta table at `path`, oldest first: ``version``,
    ``operation``, ``timestamp`` (ms) and, for Sparkpoint's commits, ``job``, ``batch``
    and ``generation`` (else None; `sinks.delta.sparkpoint_commit`); [] when it is
    no table yet. Needs deltalake."""
    from deltalake import DeltaTable

    from airflow_sparkpoint.sinks.delta import sparkpoint_commit

    if not DeltaTable.is_deltatable(str(path)):
        return []
    history = [{"version": int(entry["version"]), "operation": str(entry.get("operation", "")),
                "timestamp": entry.get("timestamp"), **sparkpoint_commit(entry)}
               for entry in DeltaTable(str(path)).history()]
    return sorted(history, key=lambda e: e["version"])


def orphaned_staged_files(table: Path | str, job: str) -> list[str]:
    """Staged parquet files of `job` in the local Delta table `table` that are not part of
    the table: output of an aborted or unfinished transaction left behind. (Committed
    appends keep their staged files: the Delta commit adds them in place, without a copy.)
    Needs deltalake."""
    from deltalake import DeltaTable

    from airflow_sparkpoint.sinks.delta import job_staging

    staging = Path(table) / job_staging(job)
    staged = {str(p) for p in staging.rglob("*.parquet")} if staging.exists() else set()
    if staged and DeltaTable.is_deltatable(str(table)):
        staged -= {str(Path(uri)) for uri in DeltaTable(str(table)).file_uris()}
    return sorted(staged)


def pending_transactions(catalog: Catalog, *, generation: int | None = None) -> list[TransactionRecord]:
    """Staged, not yet committed transactions of `catalog`'s job (of one `generation`),
    in batch order.

    :raises SparkpointError: the transaction log cannot be read.
    """
    return [r for r in catalog.transactions() if generation is None or r.generation == generation]


def staged_rows(catalog: Catalog, storage_options: Mapping[str, Any], *,
                generation: int | None = None) -> list[dict[str, Any]]:
    """The rows of `catalog`'s job's staged, not yet committed output (of one
    `generation`), in batch order: what a write-audit-publish audit checks. Read through
    each transaction's sink with `storage_options`, so it works on S3 too.

    :raises ConfigError: a transaction's sink cannot show its staged rows (only
        ``DeltaSink`` output can be read before it is committed).
    """
    rows: list[dict[str, Any]] = []
    for record in pending_transactions(catalog, generation=generation):
        sink = _configured_sink(record.sink, record.payload.get("config") or {}, storage_options)
        if record.sink != "delta":
            raise ConfigError(f"the staged rows of transaction {record.txn_id} "
                              f"({record.sink} sink) cannot be "
                              "read before they are committed; only DeltaSink "
                              "output can be audited this way")
        for staged_file in sink.staged(record)["files"]:  # confined to its own staging area
            rows += sink.location.read_parquet(staged_file["path"]).to_pylist()
    return rows


def delta_rows(table_uri: str, storage_options: Mapping[str, Any],
               columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows readers see now in the Delta table at `table_uri` (a path or ``s3://``,
    opened with `storage_options`: endpoint and credentials); [] with no table. Read with
    delta-rs' own engine (`sinks.delta_rows.read_table`)."""
    from airflow_sparkpoint.sinks.delta_rows import read_table

    sink = _configured_sink("delta", {"uri": table_uri, "mode": "append"}, storage_options)
    table = sink.location.open()
    if table is None:
        return []
    return list(read_table(table, columns).to_pylist())


def _configured_sink(kind: str, config: Mapping[str, Any], storage_options: Mapping[str, Any]) -> Any:
    """The sink of `kind` rebuilt from `config`, with `storage_options` to reach its store."""
    from airflow_sparkpoint.sinks import sink_from_config

    sink = sink_from_config(kind, config)
    sink.configure(dict(storage_options))
    return sink
