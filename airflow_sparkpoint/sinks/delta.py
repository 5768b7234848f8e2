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
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import (
    CommitOutcomeUnknown,
    ConfigError,
    SinkAheadError,
    SinkError,
    StorageError,
    TransactionConflict,
)
from airflow_sparkpoint.sinks import _claims, _delta_schema, _delta_txn, spark_compat
from airflow_sparkpoint.sinks._delta_location import STAGING, table_location
from airflow_sparkpoint.sinks._delta_location import import_deltalake as _import_deltalake
from airflow_sparkpoint.sinks._delta_txn import job_staging, sparkpoint_commit
from airflow_sparkpoint.sinks.base import (
    CommitOutcome,
    CommittedTxn,
    Sink,
    StageContext,
    column_names,
    is_orphan,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

# the staging layout and the commit info are `_delta_txn`'s; re-exported for the readers of a table
__all__ = ["STAGING", "DeltaSink", "job_staging", "sparkpoint_commit"]

log = logging.getLogger(__name__)

#: `DeltaSink._landed`: the batch was committed by the transaction asked about
_OURS = object()


class DeltaSink(Sink):
    """Two-phase-commit sink into a Delta table (see the module docstring).

    :param uri: table location: a path, ``file:///path`` or ``s3://bucket/path/to/table``
        (``s3a://`` is an alias). S3 connection options (endpoint, region, credentials) come
        from `configure` (the job's ``spark.sparkpoint.s3.*`` settings, the Airflow
        connection) and boto3's default chain, never from the URI.
    :param mode: ``append`` adds the batch's rows; ``merge`` upserts them by `keys`.
    :param keys: merge keys: a column name or a list (required for ``merge``, not allowed for
        ``append``).
    :param partition_by: partition columns of the table: a column name or a list.
    """

    kind = "delta"
    can_rewind = True

    def __init__(
        self,
        uri: str,
        mode: str = "append",
        keys: str | Sequence[str] | None = None,
        partition_by: str | Sequence[str] | None = None,
    ) -> None:
        if not isinstance(uri, str) or not uri.strip():
            raise ConfigError(f"DeltaSink uri={uri!r} is empty; expected a table path")
        if mode not in ("append", "merge"):
            raise ConfigError(f"DeltaSink mode={mode!r} is not allowed; expected 'append' or 'merge'")
        keys = column_names("DeltaSink", "keys", keys)
        if mode == "merge" and not keys:
            raise ConfigError("DeltaSink mode='merge' needs keys=[...] (the columns that identify a row)")
        if mode == "append" and keys:
            raise ConfigError(f"DeltaSink keys={keys!r} are only used with mode='merge'")
        self.uri = uri
        self.location = table_location(uri)  # opens the table, reads staged files (local or S3)
        #: the table as delta-rs opens it: an absolute path or ``s3://bucket/prefix``
        self.path = self.location.uri
        self.mode = mode
        self.keys = keys
        self.partition_by = column_names("DeltaSink", "partition_by", partition_by)

    def __repr__(self) -> str:
        return (f"DeltaSink({self.uri!r}, mode={self.mode!r}, keys={self.keys!r}, "
                f"partition_by={self.partition_by!r})")

    @property
    def sink_id(self) -> str:
        return f"delta:{self.path}"

    location_uri = property(lambda self: self.location.location_uri, doc="`Sink.location_uri`")

    def to_config(self) -> dict[str, Any]:
        return {"uri": self.uri, "mode": self.mode, "keys": self.keys, "partition_by": self.partition_by}

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        self.location.configure(storage_options)

    # ------------------------------------------------------------------ table access

    def _table(self) -> DeltaTable | None:
        return self.location.open()

    def validate(self) -> None:
        self.location.check()
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
        """The staging area of a transaction, relative to the table root (`_delta_txn.staging_dir`)."""
        return _delta_txn.staging_dir(job, txn_id)

    def staged(self, record: TransactionRecord) -> dict[str, Any]:
        """The staged batch `record` describes, confined to its own staging area
        (`_delta_txn.staged`, which says what it raises)."""
        return _delta_txn.staged(record)

    # ------------------------------------------------------------------ stage

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        if ctx.storage_options:
            self.configure(ctx.storage_options)
        schema = spark_compat.arrow_schema(df.schema)
        _delta_schema.check_columns(self, schema, ctx, self.keys, self.partition_by)
        _delta_schema.check_schema(self._table(), schema, self.uri)
        staging = self._staging_dir(ctx.job, ctx.txn_id)
        partition_by = self.partition_by if self.mode == "append" else []
        files = self.location.stage(df, staging, partition_by, ctx.driver_staging_max_bytes)
        if self.mode == "merge":
            try:
                _delta_schema.check_unique_keys(self, files, ctx, self.keys, self.location.read_parquet)
            except SinkError:
                self.location.remove(staging)
                raise
        faults.pause("staged", ctx.batch_id, txn=ctx.txn_id)
        return {
            "mode": self.mode,
            "staging": staging,
            "files": files,
            "rows": sum(int(f["num_records"]) for f in files),
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        }

    # ------------------------------------------------------------------ commit / abort

    def _commit_properties(self, record: TransactionRecord) -> Any:
        deltalake = _import_deltalake()
        return deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id=record.job, version=record.batch_id)],
            custom_metadata=_delta_txn.commit_info(record),
        )

    def is_committed(self, record: TransactionRecord) -> bool:
        """Whether batch ``record.batch_id`` was committed to the table by this very
        transaction (its generation), read from the table's history."""
        table = self._table()
        return table is not None and self._landed(table, record) is _OURS

    def decision(self, record: TransactionRecord) -> str | None:
        return _claims.decided(self.location.store(), record)

    def was_committed(self, record: TransactionRecord) -> bool:
        table = self._table()
        return table is not None and _delta_txn.ever_committed(table, record)

    def committed_txn(self, job: str, batch_id: int) -> CommittedTxn | None:
        table = self._table()
        if table is None:
            return None
        version = table.transaction_version(job)
        if version is None or version < batch_id:
            return None
        entry = _delta_txn.batch_commit(table, job, batch_id)
        if entry is None or entry.get(_delta_txn.GENERATION_KEY) is None:
            return CommittedTxn(job=job, batch_id=batch_id, generation=None, txn_id=None)
        generation = int(entry[_delta_txn.GENERATION_KEY])
        txn = entry.get(_delta_txn.TXN_KEY) or layout.txn_id(job, batch_id, generation)
        return CommittedTxn(job=job, batch_id=batch_id, generation=generation, txn_id=str(txn))

    def batch_files(self, job: str, batch_id: int) -> list[str] | None:
        """URIs of the files the commit of batch `batch_id` of `job` added, or None (not
        committed): what a shadow's comparison reads (`runtime.follow_compare`)."""
        table = self._table()
        return _delta_txn.batch_files(table, job, batch_id) if table is not None else None

    def replay_record(self, job: str, batch_id: int) -> str | None:
        table = self._table()
        entry = _delta_txn.batch_commit(table, job, batch_id) if table is not None else None
        return _delta_txn.replay_in(entry)

    def _landed(self, table: DeltaTable, record: TransactionRecord) -> Any:
        """`_OURS` when `record` committed its batch, a `CommittedTxn` when another
        transaction did, None when the batch is not committed."""
        version = table.transaction_version(record.job)
        if version is None or version < record.batch_id:
            return None
        entry = _delta_txn.batch_commit(table, record.job, record.batch_id)
        if entry is not None and entry.get(_delta_txn.GENERATION_KEY) is not None:
            generation = int(entry[_delta_txn.GENERATION_KEY])
            if generation == record.generation:
                return _OURS
            return CommittedTxn(record.job, record.batch_id, generation,
                                str(entry.get(_delta_txn.TXN_KEY)
                                    or layout.txn_id(record.job, record.batch_id, generation)))
        # The history does not say (a commit of an old release, or its log entry was
        # cleaned up): an append is ours iff our files are in the table; for a merge it
        # cannot be told, and the batch counts as ours (the previous release's answer).
        staged = record.payload.get("staged") or {}
        if staged.get("mode", self.mode) == "append" and staged.get("files"):
            if staged["files"][0]["path"] in _delta_txn.table_paths(table):
                return _OURS
            return CommittedTxn(record.job, record.batch_id, None, None)
        log.warning("cannot tell which transaction committed batch %d of %s to %s (no commit info); "
                    "taking it as %s", record.batch_id, record.job, self.uri, record.txn_id)
        return _OURS

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        """One Delta commit of the staged batch, keyed by the app transaction (job, batch).

        :raises TransactionConflict: another transaction (generation) committed the batch;
            this one's staged data was discarded.
        :raises SinkError: the commit certainly failed, or the transaction was aborted.
        :raises CommitOutcomeUnknown: the table cannot be read after a failed commit.
        """
        self.staged(record)  # a malformed or forged record fails before anything is written
        table = self._table()
        if table is not None:
            landed = self._landed(table, record)
            if landed is _OURS:
                # Landed earlier (a commit step killed after the log entry): what is left
                # staged for this transaction is no longer needed.
                if self.staged(record).get("mode", self.mode) == "merge":
                    self._drop_staging(record)
                return CommitOutcome(record.txn_id, "already", {"version": table.version()})
            if landed is not None:
                self._lose(record, landed)
        faults.pause("before_claim", record.batch_id, txn=record.txn_id)
        decision = self._decide(record, "promote")
        if decision.get("decision") != "promote":
            table = self._table()
            landed = self._landed(table, record) if table is not None else None
            if landed is not None and landed is not _OURS:
                self._lose(record, landed)
            raise SinkError(
                f"transaction {record.txn_id} was aborted (its staged data may be "
                "gone); it cannot be committed "
                f"to {self.uri}. Batch {record.batch_id} is produced again by the run that aborted it"
            )
        faults.pause("claimed", record.batch_id, txn=record.txn_id)
        return self._write(record, table)

    def _write(self, record: TransactionRecord, table: DeltaTable | None) -> CommitOutcome:
        """The Delta commit of a transaction decided to promote."""
        import pyarrow as pa

        staged = self.staged(record)
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(staged["schema"])))
        props = self._commit_properties(record)
        try:
            if staged.get("mode", self.mode) == "merge":
                self._merge(table, staged, schema, props)
            else:
                self._append(table, staged, schema, props)
        except Exception as exc:
            # Did it land anyway (e.g. a timeout after the log entry was written)? Or did
            # another transaction of the batch land first (delta-rs: concurrent transaction)?
            failure = self._scrub(str(exc))
            created = table is None
            try:
                table = self._table()
                landed = self._landed(table, record) if table is not None else None
            except Exception as again:  # noqa: BLE001 - the table cannot be read: keep everything
                raise CommitOutcomeUnknown(
                    f"Delta commit of batch {record.batch_id} to {self.uri} failed ({failure}) and the table "
                    f"cannot be read ({self._scrub(str(again))}); the staged files are "
                    "kept, run the commit again"
                ) from None
            if landed is _OURS:
                log.warning("commit of %s raised %s but the table has it", record.txn_id, failure)
            elif landed is not None:
                self._lose(record, landed)
            elif created and table is not None:
                # Our create found a table created meanwhile without this batch: commit
                # against its snapshot, where a concurrent commit of the batch conflicts.
                return self._write(record, table)
            else:
                raise SinkError(f"Delta commit of batch {record.batch_id} to "
                                f"{self.uri} failed: {failure}") from exc
        faults.maybe_kill("promoting", record.batch_id)  # landed; the caller does not know yet
        faults.pause("landed", record.batch_id, txn=record.txn_id)
        if table is None:
            table = _import_deltalake().DeltaTable(self.path, storage_options=self.location.delta_options())
        else:
            table.update_incremental()  # reads only the new log entries
        if staged.get("mode", self.mode) == "merge":
            self._drop_staging(record)
        return CommitOutcome(record.txn_id, "committed", {"version": table.version()})

    def _decide(self, record: TransactionRecord, decision: str) -> dict[str, Any]:
        """The decision (promote | abort) that stands for `record` (`_delta_txn`).

        :raises CommitOutcomeUnknown: the store failed; nothing is known.
        """
        try:
            return _claims.decide(self.location.store(), _claims.decision_key(record.job, record.txn_id),
                                  _claims.decision_body(record, decision))
        except StorageError as exc:
            raise CommitOutcomeUnknown(
                f"cannot record the {decision} decision of {record.txn_id} in {self.uri}: {exc}; nothing was "
                "committed or deleted, run it again"
            ) from None

    def _lose(self, record: TransactionRecord, winner: CommittedTxn) -> None:
        """`record` lost its batch to `winner`: discard its own staged data and raise."""
        self._decide(record, "abort")  # a no-op if it had decided to promote: it never lands now
        self._drop_staging(record)
        log.warning("%s lost batch %d to %s in %s; its staged data was discarded", record.txn_id,
                    record.batch_id, winner.txn_id or "another transaction", self.uri)
        raise TransactionConflict(
            f"batch {record.batch_id} of job {record.job!r} was already committed to "
            f"{self.uri} by transaction "
            f"{winner.txn_id or '(unknown)'} (generation "
            f"{winner.generation if winner.generation is not None else '?'}); "
            f"transaction {record.txn_id!r} (generation {record.generation}) lost the batch "
            "and its staged data was "
            "discarded (committing it too would duplicate or overwrite the batch)"
        )

    def _drop_staging(self, record: TransactionRecord) -> None:
        """Remove a settled transaction's staging area (merged rows, or an attempt that
        lost to another); a failure only leaves garbage for `cleanup_orphans`."""
        try:
            self.location.remove(self.staged(record)["staging"])
        except SinkError as exc:
            log.warning("could not remove the staging area of %s: %s", record.txn_id, exc)

    def _scrub(self, message: str) -> str:
        """`message` without credentials (delta-rs errors on S3 may quote its options)."""
        return self.location.scrub(message)

    def _append(self, table: DeltaTable | None, staged: Mapping[str, Any], schema: pa.Schema,
                props: Any) -> None:
        deltalake = _import_deltalake()
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        missing = self.location.missing([f["path"] for f in staged["files"]])
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
        if table is None:  # a create that fails if the table exists (then `_write` looks again)
            create_table_with_add_actions(
                self.path, deltalake.Schema.from_arrow(schema), adds, mode="error",
                partition_by=self.partition_by or None, commit_properties=props,
                storage_options=self.location.delta_options(),
            )
        else:
            actions: list[AddAction | RemoveAction] = list(adds)
            table.create_write_transaction(
                actions, mode="append", schema=schema, partition_by=self.partition_by or None,
                commit_properties=props
            )

    def _merge(self, table: DeltaTable | None, staged: Mapping[str, Any], schema: pa.Schema,
               props: Any) -> None:
        deltalake = _import_deltalake()
        import pyarrow as pa

        parts = [self.location.read_parquet(f["path"]) for f in staged["files"]]
        rows = pa.concat_tables(parts).select(schema.names).cast(schema) if parts else schema.empty_table()
        dupes = _delta_schema.duplicate_keys(rows, self.keys)
        if dupes.num_rows:
            sample = dupes.slice(0, 3).drop_columns(["count_all"]).to_pylist()
            raise SinkError(f"merge keys {self.keys} are not unique within the batch (e.g. {sample}); "
                            "a merge needs one row per key per batch")
        if table is None:
            # Never "append": created meanwhile, the table would get the batch at its
            # latest version with no conflict (delta-rs does not check the app version).
            deltalake.write_deltalake(self.path, rows, mode="error", partition_by=self.partition_by or None,
                                      commit_properties=props, storage_options=self.location.delta_options())
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
        """Delete the transaction's staging area, unless it committed.

        A transaction whose committer decided to promote and stalled or died before its
        Delta commit is committed for it (`_delta_txn`) and then counts as committed.

        :raises SinkError: the transaction committed its batch; it cannot be aborted, or its
            record is malformed or forged (`staged`: nothing is touched).
        """
        self.staged(record)
        table = self._table()
        landed = self._landed(table, record) if table is not None else None
        if landed is _OURS:
            raise SinkError(f"transaction {record.txn_id} has committed to {self.uri}; it cannot be aborted")
        decision = self._decide(record, "abort")
        if decision.get("decision") == "promote" and landed is None:
            if table is not None and _delta_txn.ever_committed(table, record):
                log.info("%s was committed and then rewound; its staged data is discarded", record.txn_id)
            else:
                log.warning("%s decided to commit but did not land (a stalled or dead "
                            "committer): committing it",
                            record.txn_id)
                faults.pause("claimed", record.batch_id, txn=record.txn_id)
                try:
                    self._write(record, table)
                except TransactionConflict:
                    return  # another transaction holds the batch; this one's staging was discarded
                except CommitOutcomeUnknown:
                    raise
                except SinkError as exc:
                    # It certainly cannot land (e.g. its staged files are gone): nothing of
                    # it is in the table, and no committer can make it land either.
                    log.warning("%s cannot be committed (%s); aborting it", record.txn_id, exc)
                else:
                    raise SinkError(f"transaction {record.txn_id} has committed to "
                                    f"{self.uri} (its stalled commit "
                                    "was finished); it cannot be aborted")
        self.location.remove(self.staged(record)["staging"])
        log.info("aborted %s in %s", record.txn_id, self.uri)

    def rewind_problem(self, job: str, snapshot: SnapshotMetadata) -> str | None:
        table = self._table()
        if table is None:
            return None
        try:
            self._checked_target(table.history(), job, snapshot)
        except SinkAheadError as exc:
            return str(exc)
        return None

    def _checked_target(self, history: list[dict[str, Any]], job: str,
                        snapshot: SnapshotMetadata) -> tuple[int, int]:
        """`_delta_txn.rewind_target`, refused when a later version is not the job's own or a
        file of the target version is gone (a rewound lineage's staged files are
        discarded: its own rewind, or a vacuum, took them).

        :raises SinkAheadError: the rewind cannot be done.
        """
        target, committed_batch = _delta_txn.rewind_target(history, job, snapshot, self.sink_id, self.uri)
        for entry in history:
            version = int(entry.get("version", -1))
            if version > target and entry.get(_delta_txn.JOB_KEY) != job:
                raise SinkAheadError(
                    f"cannot rewind {self.uri} to version {target}: version {version} "
                    f"({entry.get('operation')}) was not written by job {job!r}"
                )
        if target >= 0:
            past = _import_deltalake().DeltaTable(self.path, version=target,
                                                  storage_options=self.location.delta_options())
            missing = self.location.missing(sorted(_delta_txn.table_paths(past)))
            if missing:
                raise SinkAheadError(
                    f"cannot rewind {self.uri} to version {target}: {len(missing)} of "
                    "its files are gone (e.g. "
                    f"{missing[0]}); the lineage that committed them was rewound away and its data discarded"
                )
        return target, committed_batch

    def committed_position(self, job: str) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(job)

    def cleanup_orphans(self, job: str, keep: set[str], *, upto_generation: int | None = None) -> int:
        """Delete the staging areas of `job` no record refers to (`is_orphan`,
        `_orphan_is_garbage`): only directories named as a transaction id of `job`
        (anything else there, a link included, is not this job's to delete)."""
        root = _delta_txn.job_staging(job)
        names = self.location.list_dirs(root)
        candidates = [n for n in names if is_orphan(n, keep, upto_generation)
                      and (layout.parse_txn_id(n) or ("",))[0] == job]
        if not candidates:
            return 0
        table = self._table()
        referenced_dirs: set[str] = set()
        if table is not None and self.mode == "append":
            prefix = f"{_delta_txn.job_staging(job)}/"
            for path in _delta_txn.table_paths(table):
                if path.startswith(prefix):
                    referenced_dirs.add(path[len(prefix):].split("/", 1)[0])
        removed = 0
        for name in candidates:
            if name in referenced_dirs:
                continue
            if not self._orphan_is_garbage(table, name):
                continue
            self.location.remove(f"{root}/{name}")
            removed += 1
        return removed

    def _orphan_is_garbage(self, table: DeltaTable | None, txn: str) -> bool:
        """Whether a staging area no record refers to may go: its transaction is decided
        abort now, or was decided promote and landed (merged) or lost its batch. One
        decided to promote whose commit has not landed is left for its committer."""
        parsed = layout.parse_txn_id(txn)
        if parsed is None:
            return False  # not a transaction's staging area: not this sink's to delete
        job, batch, generation = parsed
        record = TransactionRecord(job=job, batch_id=batch, generation=generation, sink=self.kind,
                                   sink_id=self.sink_id, payload={})
        if self._decide(record, "abort").get("decision") != "promote":
            return True
        landed = self._landed(table, record) if table is not None else None
        if landed is None and not (table is not None and _delta_txn.ever_committed(table, record)):
            log.warning("staging area %s of %s is decided to commit and has not landed; left in place", txn,
                        self.uri)
            return False
        return True

    # ------------------------------------------------------------------ rewind (invariant 4)

    def rewind(self, job: str, snapshot: SnapshotMetadata) -> None:
        """Restore the table to its state right after the snapshot's lineage committed its
        last batch at or before the snapshot's batch, lowering the job's transaction
        version with it (the snapshot's pending transactions are committed again by the
        restore).

        The target is that lineage's own commit (`SnapshotMetadata.batch_owners`): the
        commit of its newest batch the snapshot does not list as pending, by the
        generation that staged it, even when another lineage's restore undid it since;
        before the job's first commit when the lineage had committed nothing. A snapshot
        of an earlier release (no batch owners) rewinds to the newest commit of its batch,
        else to the table version it recorded.

        :raises SinkAheadError: the target is not in the table's history, or a commit
            after it is not this job's own (another writer committed since).
        """
        table = self._table()
        if table is None:
            return
        history = table.history()
        target, committed_batch = self._checked_target(history, job, snapshot)
        current = table.version()
        deltalake = _import_deltalake()
        props = deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id=job, version=committed_batch)],
            custom_metadata={_delta_txn.JOB_KEY: job, "sparkpoint.rewind": str(target)},
        )
        table.restore(target, commit_properties=props)
        log.warning("rewound Delta table %s from version %d to %d (last committed batch %d)", self.uri,
                    current, target, committed_batch)
