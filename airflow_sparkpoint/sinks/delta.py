"""`DeltaSink`: exactly-once output to a Delta table through delta-rs.

Staging: Spark writes the batch as parquet into ``<table>/_sparkpoint_txn/<job>/<txn>/``
(invisible to Delta readers: no log entry references it yet). Commit: ONE Delta commit
that either adds those files (``append``) or merges their rows by `keys` (``merge``),
carrying ``Transaction(app_id=<job>, version=<batch>)``. Whether a batch landed is read
from the table with ``transaction_version(<job>)``; delta-rs does not skip a repeated
version by itself, so every commit checks it first.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError, SinkAheadError, SinkError
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

STAGING = "_sparkpoint_txn"


def _import_deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError(f"DeltaSink needs deltalake ({exc}); install it with: pip install deltalake") from exc
    return deltalake


def _local_table_path(uri: str) -> str:
    if "://" not in uri:
        return os.path.abspath(uri)
    if uri.startswith("file://"):
        return urllib.parse.unquote(uri[len("file://"):])
    raise ConfigError(
        f"DeltaSink uri={uri!r}: this release stages Delta output on local or mounted filesystems; "
        "expected a path or file:///path"
    )


class DeltaSink(Sink):
    """Two-phase-commit sink into a Delta table (see the module docstring).

    :param uri: table location (a path or ``file:///path``).
    :param mode: ``append`` adds the batch's rows; ``merge`` upserts them by `keys`.
    :param keys: merge keys (required for ``merge``, not allowed for ``append``).
    :param partition_by: partition columns of the table.
    """

    kind = "delta"

    def __init__(
        self,
        uri: str,
        mode: str = "append",
        keys: Sequence[str] | None = None,
        partition_by: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(uri, str) or not uri.strip():
            raise ConfigError(f"DeltaSink uri={uri!r} is empty; expected a table path")
        if mode not in ("append", "merge"):
            raise ConfigError(f"DeltaSink mode={mode!r} is not allowed; expected 'append' or 'merge'")
        keys = list(keys or [])
        if mode == "merge" and not keys:
            raise ConfigError("DeltaSink mode='merge' needs keys=[...] (the columns that identify a row)")
        if mode == "append" and keys:
            raise ConfigError(f"DeltaSink keys={keys!r} are only used with mode='merge'")
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        self.uri = uri
        self.path = _local_table_path(uri)
        self.mode = mode
        self.keys = keys
        self.partition_by = list(partition_by or [])

    def __repr__(self) -> str:
        return f"DeltaSink({self.uri!r}, mode={self.mode!r}, keys={self.keys!r}, partition_by={self.partition_by!r})"

    @property
    def sink_id(self) -> str:
        return f"delta:{self.path}"

    def to_config(self) -> dict[str, Any]:
        return {"uri": self.uri, "mode": self.mode, "keys": self.keys, "partition_by": self.partition_by}

    # ------------------------------------------------------------------ table access

    def _table(self) -> DeltaTable | None:
        deltalake = _import_deltalake()
        if not deltalake.DeltaTable.is_deltatable(self.path):
            return None
        return deltalake.DeltaTable(self.path)

    def validate(self) -> None:
        parent = os.path.dirname(self.path.rstrip("/")) or "/"
        if not os.path.isdir(parent):
            raise ConfigError(f"DeltaSink uri={self.uri!r}: parent directory {parent} does not exist")
        table = self._table()
        if table is not None:
            existing = list(table.metadata().partition_columns)
            if self.partition_by and existing != self.partition_by:
                raise ConfigError(
                    f"DeltaSink partition_by={self.partition_by!r} does not match table {self.uri} "
                    f"partitioned by {existing!r}"
                )

    def _staging_dir(self, job: str, txn_id: str) -> str:
        return os.path.join(self.path, STAGING, job, txn_id)

    # ------------------------------------------------------------------ stage

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        # Spark TimestampType is an instant (UTC-adjusted), like Delta's timestamp.
        schema = to_arrow_schema(df.schema, timezone="UTC")
        self._check_schema(schema)
        staging = self._staging_dir(ctx.job, ctx.txn_id)
        writer = df.write.mode("overwrite").option("compression", "snappy")
        if self.partition_by and self.mode == "append":
            writer = writer.partitionBy(*self.partition_by)
        # Spark's writer consumes every partition of the batch, as Spark 4.2 requires.
        writer.parquet(staging)
        files = []
        rows = 0
        for dirpath, dirnames, filenames in os.walk(staging):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
            for name in sorted(filenames):
                if name.startswith((".", "_")) or not name.endswith(".parquet"):
                    continue
                full = os.path.join(dirpath, name)
                num = pq.read_metadata(full).num_rows
                rel_dir = os.path.relpath(dirpath, staging)
                partition_values = {}
                if rel_dir != ".":
                    for segment in rel_dir.split(os.sep):
                        col, _, value = segment.partition("=")
                        value = urllib.parse.unquote(value)
                        partition_values[col] = None if value == "__HIVE_DEFAULT_PARTITION__" else value
                files.append({
                    "path": os.path.relpath(full, self.path).replace(os.sep, "/"),
                    "size": os.path.getsize(full),
                    "partition_values": partition_values,
                    "num_records": num,
                    "modification_time": int(os.path.getmtime(full) * 1000),
                })
                rows += num
        return {
            "mode": self.mode,
            "staging": os.path.relpath(staging, self.path).replace(os.sep, "/"),
            "files": files,
            "rows": rows,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        }

    def _check_schema(self, schema: pa.Schema) -> None:
        """A batch whose columns or types differ from the table fails before staging."""
        import pyarrow as pa

        table = self._table()
        if table is None:
            return
        existing = pa.schema(table.schema().to_arrow())
        want = {f.name: f.type for f in existing}
        got = {f.name: f.type for f in schema}
        if set(want) != set(got):
            raise SinkError(
                f"batch columns {sorted(got)} do not match Delta table {self.uri} columns {sorted(want)}; "
                "schema evolution is not automatic"
            )
        for name, typ in got.items():
            if not _types_compatible(want[name], typ):
                raise SinkError(f"column {name!r} is {typ} in the batch but {want[name]} in Delta table {self.uri}")

    # ------------------------------------------------------------------ commit / abort

    def _commit_properties(self, record: TransactionRecord) -> Any:
        deltalake = _import_deltalake()
        return deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id=record.job, version=record.batch_id)],
            custom_metadata={
                "sparkpoint.job": record.job,
                "sparkpoint.batch": str(record.batch_id),
                "sparkpoint.generation": str(record.generation),
            },
        )

    def is_committed(self, record: TransactionRecord) -> bool:
        table = self._table()
        if table is None:
            return False
        version = table.transaction_version(record.job)
        if version is None or version < record.batch_id:
            return False
        staged = record.payload["staged"]
        if staged.get("mode", self.mode) == "merge" or not staged["files"]:
            return True
        # Another attempt of the same batch may have landed instead of this one.
        return staged["files"][0]["path"] in self._table_paths(table)

    @staticmethod
    def _table_paths(table: DeltaTable) -> set[str]:
        import pyarrow as pa

        return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        deltalake = _import_deltalake()
        import pyarrow as pa

        staged = record.payload["staged"]
        table = self._table()
        if table is not None:
            version = table.transaction_version(record.job)
            if version is not None and version >= record.batch_id:
                return CommitOutcome(record.txn_id, "already", {"version": table.version()})
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(staged["schema"])))
        props = self._commit_properties(record)
        try:
            if staged.get("mode", self.mode) == "merge":
                self._merge(table, staged, schema, props)
            else:
                self._append(table, staged, schema, props)
        except Exception as exc:
            # Did it land anyway (e.g. a timeout after the log entry was written)?
            table = self._table()
            if table is not None and (table.transaction_version(record.job) or -1) >= record.batch_id:
                log.warning("commit of %s raised %s but the table has it", record.txn_id, exc)
            else:
                raise SinkError(f"Delta commit of batch {record.batch_id} to {self.uri} failed: {exc}") from exc
        faults.maybe_kill("promoting", record.batch_id)  # landed; the caller does not know yet
        table = deltalake.DeltaTable(self.path)
        if staged.get("mode", self.mode) == "merge":
            shutil.rmtree(os.path.join(self.path, staged["staging"]), ignore_errors=True)
        return CommitOutcome(record.txn_id, "committed", {"version": table.version()})

    def _append(self, table: DeltaTable | None, staged: Mapping[str, Any], schema: pa.Schema, props: Any) -> None:
        deltalake = _import_deltalake()
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        missing = [f["path"] for f in staged["files"] if not os.path.exists(os.path.join(self.path, f["path"]))]
        if missing:
            # Never reference files that are gone: the transaction was aborted meanwhile.
            raise SinkError(
                f"staged files of this transaction are gone from {self.uri} (e.g. {missing[0]}); "
                "it was aborted and cannot be committed"
            )
        adds = [
            AddAction(
                path=f["path"], size=int(f["size"]), partition_values=dict(f["partition_values"]),
                modification_time=int(f["modification_time"]), data_change=True,
                stats=json.dumps({"numRecords": int(f["num_records"])}),
            )
            for f in staged["files"]
        ]
        if table is None:
            create_table_with_add_actions(
                self.path, deltalake.Schema.from_arrow(schema), adds, mode="append",
                partition_by=self.partition_by or None, commit_properties=props,
            )
        else:
            actions: list[AddAction | RemoveAction] = list(adds)
            table.create_write_transaction(
                actions, mode="append", schema=schema, partition_by=self.partition_by or None, commit_properties=props
            )

    def _merge(self, table: DeltaTable | None, staged: Mapping[str, Any], schema: pa.Schema, props: Any) -> None:
        deltalake = _import_deltalake()
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        parts = [pq.read_table(os.path.join(self.path, f["path"])) for f in staged["files"]]
        rows = pa.concat_tables(parts).select(schema.names).cast(schema) if parts else schema.empty_table()
        if rows.num_rows:
            counts = rows.group_by(self.keys).aggregate([([], "count_all")])
            dupes = counts.filter(pc.greater(counts["count_all"], 1))
            if dupes.num_rows:
                sample = dupes.slice(0, 3).drop_columns(["count_all"]).to_pylist()
                raise SinkError(
                    f"merge keys {self.keys} are not unique within the batch (e.g. {sample}); "
                    "a merge needs one row per key per batch"
                )
        if table is None:
            deltalake.write_deltalake(self.path, rows, mode="append", partition_by=self.partition_by or None,
                                      commit_properties=props)
            return
        if rows.num_rows == 0:
            table.create_write_transaction([], mode="append", schema=pa.schema(table.schema().to_arrow()),
                                           commit_properties=props)
            return
        predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.keys)
        (
            table.merge(rows, predicate, source_alias="s", target_alias="t", commit_properties=props)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def abort(self, record: TransactionRecord) -> None:
        staged = record.payload["staged"]
        if staged.get("mode", self.mode) == "append" and staged["files"]:
            table = self._table()
            if table is not None and staged["files"][0]["path"] in self._table_paths(table):
                log.warning("not aborting %s: its files are part of table %s", record.txn_id, self.uri)
                return
        shutil.rmtree(os.path.join(self.path, staged["staging"]), ignore_errors=True)

    def committed_position(self, job: str) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(job)

    def cleanup_orphans(self, job: str, keep: set[str]) -> int:
        root = os.path.join(self.path, STAGING, job)
        try:
            names = sorted(os.listdir(root))
        except FileNotFoundError:
            return 0
        candidates = [n for n in names if n not in keep]
        if not candidates:
            return 0
        table = self._table()
        referenced_dirs: set[str] = set()
        if table is not None and self.mode == "append":
            prefix = f"{STAGING}/{job}/"
            for path in self._table_paths(table):
                if path.startswith(prefix):
                    referenced_dirs.add(path[len(prefix):].split("/", 1)[0])
        removed = 0
        for name in candidates:
            if name in referenced_dirs:
                continue
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed += 1
        return removed

    # ------------------------------------------------------------------ rewind (invariant 4)

    def rewind(self, job: str, snapshot: SnapshotMetadata) -> None:
        """Restore the table to its state right after the snapshot's batch was committed,
        lowering the job's transaction version with it.

        The target is the commit of batch ``snapshot.batch_id`` by `job` when the table's
        history has it (the snapshot's pending transactions then count as landed), else
        the table version recorded in the snapshot (its pending transactions, never
        committed, are committed again by the restore).

        :raises SinkAheadError: neither is known, or a commit after the target is not this
            job's own (another writer committed since).
        """
        table = self._table()
        if table is None:
            return
        history = table.history()
        target: int | None = None
        committed_batch = -1
        for entry in history:  # newest first
            if (entry.get("sparkpoint.job") == job and entry.get("sparkpoint.batch") == str(snapshot.batch_id)
                    and entry.get("operation") != "RESTORE"):
                target, committed_batch = int(entry["version"]), snapshot.batch_id
                break
        if target is None:
            position = snapshot.sink_positions.get(self.sink_id)
            if not isinstance(position, Mapping) or "version" not in position:
                raise SinkAheadError(
                    f"cannot rewind {self.uri}: snapshot {snapshot.kind} {snapshot.id} recorded no table version "
                    f"and the table has no commit of batch {snapshot.batch_id} of job {job!r}"
                )
            target, committed_batch = int(position["version"]), int(position.get("batch", -1))
        current = table.version()
        for entry in history:
            version = int(entry.get("version", -1))
            if version > target and entry.get("sparkpoint.job") != job:
                raise SinkAheadError(
                    f"cannot rewind {self.uri} to version {target}: version {version} "
                    f"({entry.get('operation')}) was not written by job {job!r}"
                )
        deltalake = _import_deltalake()
        props = deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id=job, version=committed_batch)],
            custom_metadata={"sparkpoint.job": job, "sparkpoint.rewind": str(target)},
        )
        table.restore(target, commit_properties=props)
        log.warning("rewound Delta table %s from version %d to %d (last committed batch %d)", self.uri, current,
                    target, committed_batch)


def _types_compatible(table_type: pa.DataType, batch_type: pa.DataType) -> bool:
    import pyarrow as pa

    if table_type == batch_type:
        return True
    # Delta stores strings as large_string/string_view and timestamps without zone info.
    for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view):
        if check(batch_type):
            return pa.types.is_string(table_type) or pa.types.is_large_string(table_type) or \
                pa.types.is_string_view(table_type)
    return bool(pa.types.is_timestamp(table_type) and pa.types.is_timestamp(batch_type))


