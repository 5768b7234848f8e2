"""Where a `DeltaSink` table lives: the storage differences behind one small interface,
so the sink's two-phase-commit logic is written once.

=================  =================================  =========================================
                   `LocalTable` (path, ``file://``)   `S3Table` (``s3://``, ``s3a://``)
=================  =================================  =========================================
stage (small)      the driver collects the batch as Arrow and writes parquet with pyarrow
                   (`_delta_stage`): into the         uploaded with boto3
                   staging directory
stage (large)      Spark's own parquet writer into    executors write parquet with pyarrow and
                   the staging directory              upload plain objects with boto3
                                                      (`_delta_stage`): Spark needs no s3a
delta-rs options   none                               endpoint, region, credentials, conditional
                                                      put (never unsafe rename)
staged files       `storage.localfs` (no link         `S3Storage` (boto3)
                   followed)
=================  =================================  =========================================

Commits are safe with concurrent writers on S3 because delta-rs (1.x) writes each log
entry ``_delta_log/<version>.json`` with a conditional put (``If-None-Match: *``): of two
writers of the same version exactly one wins, the other re-checks for conflicts and
retries at the next version, or fails. `S3Table` asks for it explicitly
(``conditional_put=etag``) and pins ``AWS_S3_ALLOW_UNSAFE_RENAME=false`` so that an
environment variable cannot switch the log store to the unsafe rename-based commit.
"""

from __future__ import annotations

import abc
import logging
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, SinkError, StorageError
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks._delta_stage import (
    RESULT_DDL,
    DeltaStageSpec,
    StageLayout,
    collect_and_write,
    describe_spark_files,
    stage_on_driver,
    stage_partition,
    with_partition_values,
)
from airflow_sparkpoint.sinks.base import checked_bucket
from airflow_sparkpoint.storage import LocalStorage, Storage, split_uri
from airflow_sparkpoint.storage.localfs import Dir, remove_tree_at
from airflow_sparkpoint.storage.paths import confine

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from airflow_sparkpoint.storage.s3 import S3Storage

log = logging.getLogger(__name__)

#: where a `DeltaSink` stages a transaction's files, under the table root
STAGING = "_sparkpoint_txn"

#: concurrent S3 requests per driver-side existence check
_CHECK_THREADS = 16
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def import_deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError(f"DeltaSink needs deltalake ({exc}); install it "
                          "with: pip install deltalake") from exc
    return deltalake


def table_location(uri: str) -> TableLocation:
    """The location of the table at `uri`: a path, ``file:///path`` or ``s3://bucket/prefix``.

    :raises ConfigError: the URI is malformed, has no bucket or another scheme.
    """
    expected = "expected a path, file:///path or s3://bucket/path/to/table"
    try:
        scheme, bucket, path = split_uri(uri)
    except InvalidPath as exc:
        raise ConfigError(f"DeltaSink uri={uri!r} is invalid ({exc}); {expected}") from None
    if scheme == "file":
        return LocalTable(uri, path)  # a plain path made absolute; a file:// URI's path, unquoted
    if scheme != "s3":
        raise ConfigError(f"DeltaSink uri={uri!r} has scheme {scheme!r}; {expected}")
    return S3Table(uri, checked_bucket(bucket, f"DeltaSink uri={uri!r}"), path.strip("/"))


class TableLocation(abc.ABC):
    """A Delta table root and what `DeltaSink` does with the files under it. Paths are
    relative to the table root, ``/``-separated (as in Delta add actions)."""

    #: the table as delta-rs opens it; also the sink's identity
    uri: str

    def __init__(self, label: str) -> None:
        self.label = label  # the URI the user gave, for messages
        self._driver_staging = True  # off once a batch was too large to collect
        # Each thread's last handle, (options, table): Spark's stream thread and the
        # coordinator both open the table every batch, and a delta-rs handle is not
        # shared between threads.
        self._handles = threading.local()

    @property
    def location_uri(self) -> str:
        """The table root as a URI with a scheme (`Sink.location_uri`)."""
        return self.uri if "://" in self.uri else Path(self.uri).as_uri()

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        """Receive connection options (endpoint, region, credentials) at run time."""

    @abc.abstractmethod
    def delta_options(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs (may hold credentials: never log them)."""

    def scrub(self, message: str) -> str:
        """`message` without credentials (for errors raised by delta-rs)."""
        return message

    def open(self) -> DeltaTable | None:
        """The table at its newest version, or None when there is no Delta table at the
        location yet.

        This thread's handle from the last call is brought up to date instead (delta-rs
        reads only the commits since): a fresh handle replays the log from its last
        checkpoint, up to 99 commits, which grew to ~50 ms per open here and ran twice
        per batch. The handle is reused only while its newest commit is still in the log
        (a table deleted under the job reads as None again, as a fresh open would) and
        the connection options are the ones it was opened with.

        :raises SinkError: the table cannot be read (on S3).
        """
        options = self.delta_options()
        cached = getattr(self._handles, "table", None)
        self._handles.table = None
        if cached is not None and cached[0] == options:
            table = cached[1]
            try:
                table.update_incremental()
                current = self.store().exists(f"_delta_log/{table.version():020d}.json")
            except Exception as exc:  # noqa: BLE001 - a fresh open below decides, and reports
                log.debug("reopening Delta table %s: %s", self.label, self.scrub(str(exc)))
                current = False
            if current:
                self._handles.table = cached
                return table
        table = self._load(options)
        if table is not None:
            self._handles.table = (options, table)
        return table

    @abc.abstractmethod
    def _load(self, options: dict[str, str] | None) -> DeltaTable | None:
        """A fresh handle of the table at its newest version, or None when there is none."""

    @abc.abstractmethod
    def check(self) -> None:
        """Fail before anything is written unless the location can hold the table.

        :raises ConfigError: or `SinkError`, naming the value and what is expected.
        """

    def stage(self, df: DataFrame, staging: str, partition_by: Sequence[str],
              driver_max_bytes: int) -> list[dict[str, Any]]:
        """Write every row of `df` as parquet under `staging` (replacing an earlier
        attempt), split into ``col=value`` directories by `partition_by`; return the files
        as ``{path, size, partition_values, num_records, modification_time}``.

        A batch Spark estimates at no more than `driver_max_bytes` is written by the
        driver, any other by the executors (see `_delta_stage`).

        :raises SinkError: the staging area cannot be reset or written.
        """
        layout = StageLayout(staging, uuid.uuid4().hex[:16], tuple(partition_by))
        self.reset(staging)
        if self._driver_staging:
            source = with_partition_values(df, partition_by)
            if stage_on_driver(source, driver_max_bytes):
                files = self._stage_from_driver(source, layout)
                if files is not None:
                    return files
                self._driver_staging = False  # this sink's batches are too large for the driver
        return self._stage_on_executors(df, layout)

    @abc.abstractmethod
    def reset(self, staging: str) -> None:
        """Delete what an earlier attempt left under `staging`."""

    @abc.abstractmethod
    def _stage_from_driver(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]] | None:
        """`stage` by collecting `df` (with hidden partition-value columns) to the driver;
        None when it is too large to collect, with nothing written."""

    @abc.abstractmethod
    def _stage_on_executors(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]]:
        """`stage` with every executor task writing its own partition."""

    @abc.abstractmethod
    def missing(self, paths: Sequence[str]) -> list[str]:
        """The paths of `paths` that do not exist."""

    @abc.abstractmethod
    def read_parquet(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        """One staged parquet file (only `columns`, when given)."""

    @abc.abstractmethod
    def store(self) -> Storage:
        """The table root as a `Storage` (for the transactions' decision objects)."""

    @abc.abstractmethod
    def remove(self, directory: str) -> None:
        """Delete everything under `directory` (missing is fine): a staging area, which
        may have been read from a record (`staging_area`)."""

    def staging_area(self, directory: str) -> str:
        """`directory` confined inside the table's staging area (never the root, never
        outside it, whatever a record says).

        :raises SinkError: it is not; the message names the path.
        """
        return confine(directory, under=STAGING, what=f"a staging area of {self.label}", error=SinkError)

    @abc.abstractmethod
    def list_dirs(self, directory: str) -> list[str]:
        """Names directly under `directory`, sorted ([] when it does not exist)."""


class LocalTable(TableLocation):
    """A table on a local or mounted filesystem, visible to the driver and the executors."""

    def __init__(self, label: str, path: str) -> None:
        super().__init__(label)
        self.uri = path
        self._store: LocalStorage | None = None

    def delta_options(self) -> None:
        return None

    def _load(self, options: dict[str, str] | None) -> DeltaTable | None:
        deltalake = import_deltalake()
        if not deltalake.DeltaTable.is_deltatable(self.uri):
            return None
        return deltalake.DeltaTable(self.uri)

    def check(self) -> None:
        parent = os.path.dirname(self.uri.rstrip("/")) or "/"
        if not os.path.isdir(parent):
            raise ConfigError(f"DeltaSink uri={self.label!r}: parent directory {parent} does not exist")

    def _full(self, path: str) -> str:
        return os.path.join(self.uri,
                            *confine(path, what=f"a path in {self.label}", error=SinkError).split("/"))

    def _root(self, create: bool = False) -> Dir:
        """The table root, open (`storage.localfs`: nothing below it is followed).

        :raises FileNotFoundError: it does not exist (and not `create`).
        """
        return Dir.open(self.uri, create=create)

    def _refused(self, what: str, exc: InvalidPath) -> SinkError:
        return SinkError(f"{what} in {self.label} refused: {exc}; a link in the table "
                         "directory is never followed "
                         "(remove it)")

    def reset(self, staging: str) -> None:
        staging = self.staging_area(staging)
        try:
            with self._root(create=True) as root:
                # real directories: Spark and pyarrow write through them
                root.makedirs(staging.rpartition("/")[0])
                root.remove_tree(staging)  # an earlier attempt, or a link planted in its place
        except InvalidPath as exc:
            raise self._refused(f"staging into {staging}", exc) from None

    def _stage_from_driver(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]] | None:
        scratch = f"{layout.staging}/.tmp-{layout.attempt}"  # same filesystem: renames
        with self._root() as root:
            try:
                root.makedirs(scratch)

                def put(local: str, rel: str) -> None:
                    root.rename(f"{scratch}/{os.path.basename(local)}", root, rel)

                try:
                    return collect_and_write(df, layout, self._full(scratch), put)
                finally:
                    root.remove_tree(scratch)
            except InvalidPath as exc:
                raise self._refused(f"staging into {layout.staging}", exc) from None

    def _stage_on_executors(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]]:
        target = self._full(layout.staging)
        writer = df.write.mode("overwrite").option("compression", "snappy")
        if layout.partition_by:
            writer = writer.partitionBy(*layout.partition_by)
        # Spark's writer consumes every partition of the batch, as Spark 4.2 requires.
        writer.parquet(target)
        try:
            with self._root() as root:
                return describe_spark_files(root, layout.staging)
        except InvalidPath as exc:
            raise self._refused(f"staging into {layout.staging}", exc) from None

    def missing(self, paths: Sequence[str]) -> list[str]:
        try:
            root = self._root()
        except FileNotFoundError:
            return list(paths)
        with root:  # one behind a link is not staged data of this table
            return [f"{path} ({problem})" for path in paths
                    if (problem := root.file_problem(path)) is not None]

    def read_parquet(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # Through the open file (no link followed), into Arrow-owned memory as on S3.
        data = pa.BufferOutputStream()
        try:
            with self._root() as root:
                handle, _st = root.open_file(path)
        except InvalidPath as exc:
            raise self._refused(f"reading {path}", exc) from None
        except OSError as exc:
            raise SinkError(f"cannot read the staged file {self.uri}/{path}: {exc}") from None
        with handle:
            while chunk := handle.read(8 * 1024 * 1024):
                data.write(chunk)
        return pq.read_table(pa.BufferReader(data.getvalue()),
                             columns=list(columns) if columns is not None else None)

    def store(self) -> Storage:
        if self._store is None:
            self._store = LocalStorage(self.uri)
        return self._store

    def remove(self, directory: str) -> None:
        staging = self.staging_area(directory)
        try:
            with self._root() as root:
                root.remove_tree(staging)
        except FileNotFoundError:
            return
        except InvalidPath as exc:
            log.warning("not deleting %s/%s: %s; a link in the table directory is never followed", self.uri,
                        staging, exc)

    def list_dirs(self, directory: str) -> list[str]:
        try:
            with self._root() as root:
                return root.subdirs(directory)  # directories, never links
        except FileNotFoundError:
            return []
        except InvalidPath as exc:
            log.warning("not listing %s/%s: %s; a link in the table directory is never followed", self.uri,
                        directory, exc)
            return []


class S3Table(TableLocation):
    """A table under ``s3://bucket/prefix``. Staged files are plain objects written by the
    executors; the commit is one delta-rs log entry created with a conditional put.

    Credentials are resolved like boto3 does (storage options, then the environment,
    ``~/.aws``, an instance role) and handed to delta-rs explicitly, so that both always
    use the same ones; they never reach Spark conf, records, logs or ``repr``.
    """

    def __init__(self, label: str, bucket: str, prefix: str) -> None:
        super().__init__(label)
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._options: dict[str, Any] = {}
        self._store: S3Storage | None = None
        self._credentials: Any = None

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        options = manifests.options_from(storage_options)
        if options != self._options:
            self._options = options
            self._store = None
            self._credentials = None

    def _storage(self) -> S3Storage:
        if self._store is None:
            from airflow_sparkpoint.storage.s3 import S3Storage

            try:
                self._store = S3Storage(self.bucket, self.prefix, **self._options)
            except (InvalidPath, ConfigError) as exc:
                raise ConfigError(f"DeltaSink uri={self.label!r}: {exc}") from None
        return self._store

    def _resolve_credentials(self) -> Any:
        """boto3's credentials for this location (refreshed by botocore when temporary).

        :raises ConfigError: none can be found, or only part of a key pair was given.
        """
        if self._credentials is None:
            import boto3.session
            from botocore.exceptions import BotoCoreError

            try:
                session = boto3.session.Session(
                    aws_access_key_id=self._options.get("aws_access_key_id"),
                    aws_secret_access_key=self._options.get("aws_secret_access_key"),
                    aws_session_token=self._options.get("aws_session_token"),
                    region_name=self._options.get("region_name"),
                )
                credentials = session.get_credentials()
            except BotoCoreError as exc:
                raise ConfigError(f"DeltaSink uri={self.label!r}: the AWS "
                                  f"credentials are unusable ({exc})") from None
            if credentials is None:
                raise ConfigError(
                    f"DeltaSink uri={self.label!r}: no AWS credentials found for bucket "
                    f"{self.bucket!r}; expected "
                    "aws_access_key_id and aws_secret_access_key in the storage options "
                    "(the Sparkpoint Airflow "
                    "connection), the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment, "
                    "~/.aws or an instance role"
                )
            self._credentials = (credentials, session.region_name)
        return self._credentials

    def delta_options(self) -> dict[str, str]:
        from airflow_sparkpoint.storage.endpoints import redact_url as _redact_url

        credentials, region = self._resolve_credentials()
        frozen = credentials.get_frozen_credentials()
        options = {
            "AWS_ACCESS_KEY_ID": frozen.access_key,
            "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
            # The commit is a PutObject of _delta_log/<version>.json with If-None-Match: *.
            "conditional_put": "etag",
            # Overrides the environment: never the rename-based commit that can lose a race.
            "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
        }
        if frozen.token:
            options["AWS_SESSION_TOKEN"] = frozen.token
        if region:
            options["AWS_REGION"] = region
        endpoint = self._options.get("endpoint_url")
        if endpoint:
            options["AWS_ENDPOINT_URL"] = _redact_url(str(endpoint))
            if str(endpoint).lower().startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        return options

    def _load(self, options: dict[str, str] | None) -> DeltaTable | None:
        deltalake = import_deltalake()
        from deltalake.exceptions import TableNotFoundError

        try:
            return deltalake.DeltaTable(self.uri, storage_options=options)
        except TableNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - delta-rs reports S3 failures as OSError or DeltaError
            raise SinkError(f"cannot read Delta table {self.uri}: {self.scrub(str(exc))}") from None

    def scrub(self, message: str) -> str:
        """`message` on one line, without the secret key or session token (for errors
        from delta-rs, which draw nested causes over several lines)."""
        message = " ".join(_ANSI.sub("", line).strip(" \u21b3") for line in message.splitlines()
                           if line.strip())
        if self._credentials is not None:
            frozen = self._credentials[0].get_frozen_credentials()
            for secret in (frozen.secret_key, frozen.token):
                if secret:
                    message = message.replace(secret, "***")
        return self._storage().connection.scrub(message)

    def check(self) -> None:
        self._resolve_credentials()
        try:
            self._storage().check()
            self._storage().check_exclusive_create()  # commit decisions are conditional creates
        except StorageError as exc:
            raise SinkError(f"DeltaSink destination {self.uri} is not usable: {exc}") from None

    def reset(self, staging: str) -> None:
        try:
            self._storage().delete_prefix(staging)  # an earlier attempt of this transaction
        except StorageError as exc:
            raise SinkError(f"cannot reset the staging area {self.uri}/{staging}: {exc}") from None

    def _stage_from_driver(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]] | None:
        store = self._storage()
        directory = tempfile.mkdtemp(prefix="sparkpoint-delta-")
        try:
            return collect_and_write(df, layout, directory, store.upload_file)
        except StorageError as exc:
            raise SinkError(f"cannot stage into {self.uri}/{layout.staging}: {exc}") from None
        finally:
            remove_tree_at(directory)

    def _stage_on_executors(self, df: DataFrame, layout: StageLayout) -> list[dict[str, Any]]:
        import json

        spec = DeltaStageSpec(layout, self.bucket, self.prefix, dict(self._options))
        staging = layout.staging
        store = self._storage()

        def stage_batches(batches: Any) -> Any:
            return stage_partition(spec, batches)

        rows = with_partition_values(df, layout.partition_by).mapInArrow(stage_batches, RESULT_DDL).collect()
        files = sorted(
            (
                {
                    "path": r["path"],
                    "size": int(r["size"]),
                    "partition_values": json.loads(r["partition_values"]),
                    "num_records": int(r["num_records"]),
                    "modification_time": int(r["modification_time"]),
                }
                for r in rows
            ),
            key=lambda f: f["path"],
        )
        # A retried or speculative task may have left files the payload does not list.
        keep = {f["path"] for f in files}
        try:
            strays = [info.key for info in store.list(staging) if info.key not in keep]
            if strays:
                store.delete(strays)
                log.info("removed %d stray staged file(s) from %s/%s", len(strays), self.uri, staging)
        except StorageError as exc:
            raise SinkError(f"cannot list the staging area {self.uri}/{staging}: {exc}") from None
        return files

    def missing(self, paths: Sequence[str]) -> list[str]:
        if not paths:
            return []
        store = self._storage()
        with ThreadPoolExecutor(max_workers=min(_CHECK_THREADS, len(paths))) as pool:
            present = list(pool.map(store.exists, paths))
        return [p for p, there in zip(paths, present, strict=True) if not there]

    def read_parquet(self, path: str, columns: Sequence[str] | None = None) -> pa.Table:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # Into Arrow-owned memory first: a reader over the bytes object itself would let
        # Arrow's I/O threads hold a Python buffer (`airflow_sparkpoint.process_exit`).
        data = pa.BufferOutputStream()
        data.write(self._storage().get(path))
        return pq.read_table(pa.BufferReader(data.getvalue()),
                             columns=list(columns) if columns is not None else None)

    def store(self) -> Storage:
        return self._storage()

    def remove(self, directory: str) -> None:
        try:
            self._storage().delete_prefix(self.staging_area(directory))
        except StorageError as exc:
            raise SinkError(f"cannot delete {self.uri}/{directory}: {exc}") from None

    def list_dirs(self, directory: str) -> list[str]:
        try:
            return self._storage().list_dirs(directory)
        except StorageError as exc:
            raise SinkError(f"cannot list {self.uri}/{directory}: {exc}") from None
