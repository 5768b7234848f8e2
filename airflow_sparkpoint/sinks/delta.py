"""`DeltaSink`: exactly-once output to a Delta table through delta-rs.

Staging: the batch is written as parquet into ``<table>/_sparkpoint_txn/<job>/<txn>/``
(invisible to Delta readers: no log entry references it yet). Commit: ONE Delta commit
that either adds those files (``append``) or merges their rows by `keys` (``merge``),
carrying ``Transaction(app_id=<job>, version=<batch>)``. Whether a batch landed is read
from the table with ``transaction_version(<job>)``; delta-rs does not skip a repeated
version by itself, so every commit checks it first.

Tables live on a local or mounted filesystem or on S3 (files are uploaded with boto3, so
Spark needs no ``s3a``; the commit relies on S3 conditional put). A small batch is
collected and written by the driver, a large one by the executors (Spark's own writer
on a filesystem). `_delta_location` holds those differences.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import CommitOutcomeUnknown, ConfigError, SinkAheadError, SinkError
from airflow_sparkpoint.sinks._delta_location import import_deltalake as _import_deltalake
from airflow_sparkpoint.sinks._delta_location import table_location
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

STAGING = "_sparkpoint_txn"


class DeltaSink(Sink):
    """Two-phase-commit sink into a Delta table (see the module docstring).

    :param uri: table location: a path, ``file:///path`` or ``s3://bucket/path/to/table``
        (``s3a://`` is an alias). S3 connection options (endpoint, region, credentials) come
        from `configure` (the job's ``spark.sparkpoint.s3.*`` settings, the Airflow
        connection) and boto3's default chain, never from the URI.
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
        self._location = table_location(uri)
        #: the table as delta-rs opens it: an absolute path or ``s3://bucket/prefix``
        self.path = self._location.uri
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

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        self._location.configure(storage_options)

    # ------------------------------------------------------------------ table access

    def _table(self) -> DeltaTable | None:
        return self._location.open()

    def validate(self) -> None:
        self._location.check()
        table = self._table()
        if table is not None:
            existing = list(table.metadata().partition_columns)
            if self.partition_by and existing != self.partition_by:
                raise ConfigError(
                    f"DeltaSink partition_by={self.partition_by!r} does not match table {self.uri} "
                    f"partitioned by {existing!r}"
                )

    @staticmethod
    def _staging_dir(job: str, txn_id: str) -> str:
        """The staging area of a transaction, relative to the table root."""
        return f"{STAGING}/{job}/{txn_id}"

    # ------------------------------------------------------------------ stage

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        if ctx.storage_options:
            self.configure(ctx.storage_options)
        # Spark TimestampType is an instant (UTC-adjusted), like Delta's timestamp.
        schema = to_arrow_schema(df.schema, timezone="UTC")
        self._check_schema(schema)
        staging = self._staging_dir(ctx.job, ctx.txn_id)
        partition_by = self.partition_by if self.mode == "append" else []
        files = self._location.stage(df, staging, partition_by, ctx.driver_staging_max_bytes)
        return {
            "mode": self.mode,
            "staging": staging,
            "files": files,
            "rows": sum(int(f["num_records"]) for f in files),
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
        """Paths of the table's files as staged (the log holds them percent-encoded)."""
        import urllib.parse

        import pyarrow as pa

        paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        return {urllib.parse.unquote(p) for p in paths}

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        deltalake = _import_deltalake()
        import pyarrow as pa

        staged = record.payload["staged"]
        table = self._table()
        if table is not None:
            version = table.transaction_version(record.job)
            if version is not None and version >= record.batch_id:
                # Landed earlier (a commit step killed after the log entry): what is left
                # staged for this transaction is no longer needed.
                if staged.get("mode", self.mode) == "merge" or (
                    staged["files"] and staged["files"][0]["path"] not in self._table_paths(table)
                ):
                    self._drop_staging(record)
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
            failure = self._scrub(str(exc))
            try:
                table = self._table()
            except Exception as again:  # noqa: BLE001 - the table cannot be read: keep everything
                raise CommitOutcomeUnknown(
                    f"Delta commit of batch {record.batch_id} to {self.uri} failed ({failure}) and the table "
                    f"cannot be read ({self._scrub(str(again))}); the staged files are kept, run the commit again"
                ) from None
            if table is not None and (table.transaction_version(record.job) or -1) >= record.batch_id:
                log.warning("commit of %s raised %s but the table has it", record.txn_id, failure)
            else:
                raise SinkError(f"Delta commit of batch {record.batch_id} to {self.uri} failed: {failure}") from exc
        faults.maybe_kill("promoting", record.batch_id)  # landed; the caller does not know yet
        if table is None:
            table = deltalake.DeltaTable(self.path, storage_options=self._location.delta_options())
        else:
            table.update_incremental()  # reads only the new log entries
        if staged.get("mode", self.mode) == "merge":
            self._drop_staging(record)
        return CommitOutcome(record.txn_id, "committed", {"version": table.version()})

    def _drop_staging(self, record: TransactionRecord) -> None:
        """Remove a settled transaction's staging area (merged rows, or an attempt that
        lost to another); a failure only leaves garbage for `cleanup_orphans`."""
        try:
            self._location.remove(record.payload["staged"]["staging"])
        except SinkError as exc:
            log.warning("could not remove the staging area of %s: %s", record.txn_id, exc)

    def _scrub(self, message: str) -> str:
        """`message` without credentials (delta-rs errors on S3 may quote its options)."""
        return self._location.scrub(message)

    def _append(self, table: DeltaTable | None, staged: Mapping[str, Any], schema: pa.Schema, props: Any) -> None:
        deltalake = _import_deltalake()
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        missing = self._location.missing([f["path"] for f in staged["files"]])
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
                storage_options=self._location.delta_options(),
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

        parts = [self._location.read_parquet(f["path"]) for f in staged["files"]]
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
                                      commit_properties=props, storage_options=self._location.delta_options())
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
        self._location.remove(staged["staging"])

    def committed_position(self, job: str) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(job)

    def cleanup_orphans(self, job: str, keep: set[str]) -> int:
        root = f"{STAGING}/{job}"
        names = self._location.list_dirs(root)
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
            self._location.remove(f"{root}/{name}")
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


