"""`DirectorySink`: Spark's own file writer into a hidden staging area, promoted on commit.

Transaction of batch N in generation g (``txn = <job>-b<N>-g<g>``)::

    stage    df.write.format(fmt).mode("overwrite").save("<dest>/_staging/<txn>")
             Names starting with "_" are skipped by Spark's and Hadoop's readers, so
             staged files are invisible. Payload: the staged data files (relative
             paths, sizes).
    commit   the batch's claim "_sparkpoint/manifests/<job>/<N>.json" is created
             (create-exclusive / If-None-Match: exactly one transaction per batch), then
             every staged file moves to "<dest>/<partition dirs>/part-<txn>-<n>.<ext>":
             a rename on a local filesystem; server-side CopyObject + delete on S3;
             then the claim is marked done. A repeated commit is a no-op; a crashed one
             is finished from the claim. See `_claims` for the protocol.
    abort    "<dest>/_staging/<txn>" is deleted.

Destinations: local paths (plain or ``file://``; they must be visible to the driver and
the executors, as in local mode or on a shared mount) and ``s3://``/``s3a://``. For S3,
Spark writes the staging area directly through ``s3a://`` when the hadoop-aws
filesystem is on its classpath; without it (as in this project's tests) and with a
``local[...]`` master, Spark writes to a local temp directory and the driver uploads the
files to ``<dest>/_staging/<txn>/`` with boto3. Commit and abort are pure Python on both,
so an Airflow worker without a JVM can run them. Other Hadoop schemes (``hdfs://``,
``gs://``, ``abfs://``) are refused for now: promoting on them needs a JVM or libhdfs.

Local promotion renames files one at a time: a reader listing the directory during a
commit can see part of the batch. Readers that need all-or-nothing batches read the
files of finished claims, `DirectorySink.committed_files` (or use `DeltaSink`).

A local destination is a shared place (whoever writes it can plant links): every path
below it is reached through `storage.localfs` (no link followed: a staging area or a
promotion through a link is refused, a link met while deleting is unlinked, never
descended).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import (
    ConfigError,
    InvalidPath,
    ObjectNotFound,
    SinkError,
    StorageError,
)
from airflow_sparkpoint.sinks import _claims as claims
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.base import CommitOutcome, StageContext, checked_bucket, column_names, is_orphan
from airflow_sparkpoint.storage import LocalStorage, Storage, split_uri
from airflow_sparkpoint.storage.localfs import Dir, remove_tree_at
from airflow_sparkpoint.storage.paths import confine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

__all__ = ["DirectorySink"]

FORMATS = ("parquet", "json", "csv", "orc", "text")
COPY_THREADS = 16


def _is_hidden(name: str) -> bool:
    """Spark's rule (InMemoryFileIndex): ``_x`` and ``.x`` are not data, ``_col=v`` is."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def _extension(name: str) -> str:
    """``snappy.parquet`` of ``part-00000-<uuid>-c000.snappy.parquet``."""
    return name.split(".", 1)[1] if "." in name else ""


def _data_files(root: Dir, rel: str = "") -> list[dict[str, Any]]:
    """Data files under the directory `rel` of `root` that Spark wrote, as ``{"path",
    "size"}``, sorted (regular files only: a link is not data)."""
    found = root.walk_files(rel, skip=lambda name, _dir: _is_hidden(name))
    return sorted(({"path": path, "size": st.st_size} for path, st in found), key=lambda f: f["path"])


def _spark_can_write(spark: SparkSession, scheme: str) -> bool:
    """Whether Spark's Hadoop configuration has a filesystem for `scheme` (e.g. s3a)."""
    jvm: Any = getattr(spark, "_jvm", None)
    jsc: Any = getattr(spark, "_jsc", None)
    if jvm is None or jsc is None:  # Spark Connect: no JVM in this process
        return False
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, jsc.hadoopConfiguration())
    except Exception:  # noqa: BLE001 - py4j reports the missing class as a generic error
        return False
    return True


class DirectorySink(claims.FileSink):
    """Files written by Spark's own writer (any format it has), exactly once per batch.

    :param uri: destination directory: a local path, ``file:///...`` or ``s3://bucket/prefix``.
    :param format: ``parquet``, ``json``, ``csv``, ``orc`` or ``text``.
    :param partition_by: partition columns (Hive-style ``col=value`` directories): a column
        name or a list; positional (third) or keyword, as in `DeltaSink`.
    :param options: options for Spark's writer (e.g. ``{"compression": "gzip"}``); stored
        in transaction records, so never put credentials here.
    """

    kind = "directory"

    def __init__(
        self,
        uri: str,
        format: str = "parquet",
        partition_by: str | Sequence[str] | None = None,
        *,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            scheme, bucket, path = split_uri(uri)
        except InvalidPath as exc:
            raise ConfigError(
                f"DirectorySink uri {uri!r} is not supported ({exc}); expected a local path, "
                "file:///path or s3://bucket/prefix"
            ) from None
        if scheme not in ("file", "s3"):
            raise ConfigError(f"DirectorySink uri {uri!r} is not supported; expected a local path, "
                              "file:///path or s3://bucket/prefix")
        if format not in FORMATS:
            raise ConfigError(
                f"DirectorySink format {format!r} is not supported; expected one of: {', '.join(FORMATS)}"
            )
        columns = column_names("DirectorySink", "partition_by", partition_by)
        writer_options = dict(options or {})
        bad = {k: v for k, v in writer_options.items()
               if not isinstance(k, str) or not isinstance(v, (str, int, float, bool))}
        if bad:
            raise ConfigError(f"DirectorySink options {bad!r} are invalid; expected string keys and "
                              "str/int/float/bool values")
        self.format = format
        self.partition_by = columns
        self.options = writer_options
        self._local: str | None = None
        self.bucket = ""
        self.prefix = ""
        if scheme == "file":
            self._local = os.path.abspath(path)
            self.uri = "file://" + self._local
        else:
            self.bucket = checked_bucket(bucket, f"DirectorySink uri {uri!r}")
            self.prefix, self.uri = manifests.s3_destination(bucket, path)
        self._options: dict[str, Any] = {}
        self._store: Storage | None = None

    def __repr__(self) -> str:
        return f"DirectorySink({self.uri!r}, format={self.format!r})"

    # -- identity -------------------------------------------------------------------

    def to_config(self) -> dict[str, Any]:
        return {"uri": self.uri, "format": self.format, "partition_by": list(self.partition_by),
                "options": dict(self.options)}

    def _storage(self) -> Storage:
        """The destination directory as a `Storage` (manifests, listings, S3 copies)."""
        if self._store is None:
            if self._local is not None:
                self._store = LocalStorage(self._local)
            else:
                from airflow_sparkpoint.storage.s3 import S3Storage

                self._store = S3Storage(self.bucket, self.prefix, **self._options)
        return self._store

    def validate(self) -> None:
        if self._local is not None:
            if os.path.exists(self._local) and not os.path.isdir(self._local):
                raise ConfigError(f"DirectorySink destination {self._local} is a file; expected a directory")
            probe = self._local
            while not os.path.exists(probe):
                probe = os.path.dirname(probe)
            if not os.access(probe, os.W_OK | os.X_OK):
                raise SinkError(f"DirectorySink destination {self._local} is not writable (checked {probe})")
            return
        store = self._storage()
        try:
            store.check()  # type: ignore[attr-defined]
            store.check_exclusive_create()  # type: ignore[attr-defined]  # batch claims are conditional creates
        except StorageError as exc:
            raise SinkError(f"DirectorySink destination {self.uri} is not usable: {exc}") from None

    def _staging_key(self, txn: str) -> str:
        return f"{manifests.STAGING}/{txn}"

    def _root(self, create: bool = False) -> Dir:
        """The local destination, open (`storage.localfs`: nothing below it is followed).

        :raises FileNotFoundError: it does not exist (and not `create`).
        """
        assert self._local is not None
        return Dir.open(self._local, create=create)

    def _refused(self, what: str, exc: InvalidPath) -> SinkError:
        return SinkError(f"{what} in {self.uri} refused: {exc}; a link in the output "
                         "location is never followed "
                         "(remove it)")

    # -- stage ----------------------------------------------------------------------

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        if ctx.storage_options:
            self.configure(ctx.storage_options)
        txn = ctx.txn_id
        writer = df.write.format(self.format).mode("overwrite").options(**self.options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        staging = self._staging_key(txn)
        if self._local is not None:
            target = os.path.join(self._local, *staging.split("/"))
            try:
                with self._root(create=True) as root:
                    root.makedirs(manifests.STAGING)  # a real directory, not a link Spark would write through
                    root.remove_tree(staging)  # an earlier attempt (or a link planted in its place)
                writer.save("file://" + target)
                with self._root() as root:
                    files = _data_files(root, staging)
            except InvalidPath as exc:
                raise self._refused(f"staging {txn}", exc) from None
        else:
            files = self._stage_s3(df, writer, staging)
        payload = {
            "format": self.format,
            "staging": staging,
            "files": files,
            "bytes": sum(f["size"] for f in files),
        }
        log.info("staged %s: %d file(s), %d bytes in %s/%s", txn, len(files), payload["bytes"], self.uri,
                 staging)
        faults.pause("staged", ctx.batch_id, txn=txn)
        return payload

    def _stage_s3(self, df: DataFrame, writer: Any, staging: str) -> list[dict[str, Any]]:
        spark = df.sparkSession
        store = self._storage()
        if _spark_can_write(spark, "s3a"):
            writer.save(f"s3a://{self.bucket}/{self.prefix}{staging}")
            base = f"{staging}/"
            return sorted(
                ({"path": info.key[len(base):], "size": info.size} for info in store.list(staging)
                 if not any(_is_hidden(part) for part in info.key[len(base):].split("/"))),
                key=lambda f: f["path"],
            )
        master = spark.conf.get("spark.master", "") or ""
        if not master.startswith("local"):
            raise SinkError(
                f"DirectorySink to {self.uri} needs Spark's s3a filesystem (hadoop-aws on the classpath) "
                f"when the master is {master!r}; without it only a local[...] master can stage through a "
                "local temp directory"
            )
        tmp = tempfile.mkdtemp(prefix="sparkpoint-dir-")
        try:
            out = os.path.join(tmp, "out")
            writer.save("file://" + out)
            with Dir.open(out) as written:
                if not written.is_file("_SUCCESS"):
                    raise SinkError(f"Spark's write to the temp directory {out} did not "
                                    "finish (_SUCCESS missing)")
                files = _data_files(written)
            store.delete_prefix(staging)  # an earlier attempt of this transaction
            uploads = [(os.path.join(out, *f["path"].split("/")), f"{staging}/{f['path']}") for f in files]
            if uploads:
                with ThreadPoolExecutor(max_workers=min(COPY_THREADS, len(uploads))) as pool:
                    list(pool.map(lambda u: store.upload_file(*u), uploads))
        except StorageError as exc:
            raise SinkError(f"cannot upload the staged files to {self.uri}/{staging}: {exc}") from None
        finally:
            remove_tree_at(tmp)
        return files

    # -- commit ---------------------------------------------------------------------

    @staticmethod
    def _files(record: TransactionRecord) -> tuple[str, list[dict[str, Any]]]:
        what = f"transaction {record.txn_id} payload.staged"
        try:
            staged = record.payload["staged"]
            staging = confine(staged["staging"], under=manifests.STAGING, what=f"{what}.staging",
                              error=SinkError)
            return staging, [{**f, "path": confine(f["path"], what=f"{what}.files[].path", error=SinkError)}
                             for f in staged["files"]]
        except (KeyError, TypeError) as exc:
            raise SinkError(
                f"transaction {record.txn_id} has no DirectorySink payload ({exc!r}); "
                "expected payload.staged.staging and .files"
            ) from None

    @staticmethod
    def _final_path(txn: str, index: int, staged_path: str) -> str:
        """``<partition dirs>/part-<txn>-<index>.<ext>`` for a staged relative path."""
        directory, _, name = staged_path.rpartition("/")
        final = manifests.final_name(txn, index, _extension(name))
        return f"{directory}/{final}" if directory else final

    def _moves(self, record: TransactionRecord) -> tuple[str, list[tuple[str, str, int]]]:
        staging, files = self._files(record)
        moves = [
            (f"{staging}/{f['path']}", self._final_path(record.txn_id, i, f["path"]), int(f["size"]))
            for i, f in enumerate(files)
        ]
        return staging, moves

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        """Claim the batch, then move the staged files into place (`_claims`).

        :raises TransactionConflict: another transaction holds the batch; this one's
            staging area was deleted.
        :raises SinkError: the transaction was aborted, or a staged file is lost.
        :raises CommitOutcomeUnknown: the filesystem or S3 failed midway; run it again.
        """
        self._moves(record)  # a malformed record fails before anything is written
        return claims.commit(self, record)

    # -- what the claim protocol needs (`_claims.FileSink`) -------------------------------

    def _plan(self, record: TransactionRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        staging, moves = self._moves(record)
        plan = {"staging": staging, "moves": [list(m) for m in moves]}
        return plan, [{"path": dst, "size": size} for _src, dst, size in moves]

    def _missing(self, txn: str, plan: Mapping[str, Any]) -> list[str]:
        moves = [(str(src), str(dst), int(size)) for src, dst, size in plan.get("moves", ())]
        if self._local is not None:
            return self._missing_local(moves)
        store = self._storage()
        staged = {info.key for info in store.list(str(plan.get("staging") or self._staging_key(txn)))}

        def there(key: str, size: int | None = None) -> bool:
            if size is None:
                return key in staged
            try:
                return store.stat(key).size == size
            except ObjectNotFound:
                return False

        return [f"{self.uri}/{src}" for src, dst, size in moves if not there(src) and not there(dst, size)]

    def _missing_local(self, moves: Sequence[tuple[str, str, int]]) -> list[str]:
        """The sources of `moves` neither staged nor already in place (one behind a link is
        not staged data of this sink: the entry says why)."""
        try:
            root = self._root()
        except FileNotFoundError:
            return [f"{self.uri}/{src}" for src, _dst, _size in moves]
        found = []
        with root:
            for src, dst, size in moves:
                problem = root.file_problem(src)
                if problem is None:
                    continue
                try:
                    st = root.stat(dst)
                except InvalidPath:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != size:
                    found.append(f"{self.uri}/{src} ({problem})")
        return found

    def _planned(self, txn: str, plan: Mapping[str, Any] | None) -> tuple[str, list[tuple[str, str, int]]]:
        """The staging area and moves of a promotion plan read from a claim or decision
        (planted ones too): staging inside ``_staging/``, every move from inside it to
        inside the destination.

        :raises SinkError: a path escapes; the message names the claim and the path.
        """
        what = f"the promotion plan of {txn} in {self.uri}"
        staging = confine((plan or {}).get("staging") or self._staging_key(txn), under=manifests.STAGING,
                          what=f"{what}: staging", error=SinkError)
        try:
            moves = [(confine(src, under=staging, what=f"{what}: a move from", error=SinkError),
                      confine(dst, what=f"{what}: a move to", error=SinkError), int(size))
                     for src, dst, size in (plan or {}).get("moves", ())]
        except (TypeError, ValueError) as exc:
            raise SinkError(f"{what} has malformed moves ({exc}); expected "
                            "[source, target, size] lists") from None
        return staging, moves

    def _promote(self, claim: Mapping[str, Any]) -> list[str]:
        _staging, moves = self._planned(str(claim.get("txn_id")), claim["plan"])
        batch, txn = int(claim["batch_id"]), str(claim["txn_id"])
        if self._local is not None:
            with self._root(create=True) as root:
                states = claims.in_halves(None, lambda m: self._promote_local(root, *m), moves, batch, txn)
                for directory in sorted({dst.rpartition("/")[0] for _src, dst, _size in moves}):
                    root.fsync(directory)
            return states
        return self._promote_s3(moves, batch, txn)

    def _discard(self, txn: str, plan: Mapping[str, Any] | None, *, promoted_too: bool) -> int:
        store = self._storage()
        staging, moves = self._planned(txn, plan)
        promoted = []
        if promoted_too:
            for _src, dst, _size in moves:
                try:
                    store.stat(dst)
                except ObjectNotFound:
                    continue
                promoted.append(dst)
        if promoted:
            log.warning("abort of %s removes %d file(s) moved without a claim from %s", txn, len(promoted),
                        self.uri)
        try:
            store.delete(promoted)
            if self._local is not None:
                return int(self._remove_local(staging))
            return int(store.delete_prefix(staging) > 0)
        except FileNotFoundError:
            return 0
        except (OSError, StorageError) as exc:
            raise SinkError(f"cannot discard {txn} in {self.uri}: {exc}") from None

    def _after_done(self, claim: Mapping[str, Any]) -> None:
        self._drop_staging(self._planned(str(claim.get("txn_id")), claim.get("plan"))[0])

    def _file_uri(self, file: Mapping[str, Any]) -> str:
        return f"{self.uri}/{confine(file.get('path'), what=f'a claim file in {self.uri}', error=SinkError)}"

    def _remove_local(self, staging: str) -> bool:
        """Delete a staging area of the local destination (a link in its place is
        unlinked, never followed); whether it was there. One behind a link (``_staging``
        itself a link) is not this sink's: nothing is deleted, with a warning."""
        try:
            with self._root() as root:
                return root.remove_tree(staging)
        except InvalidPath as exc:
            log.warning("not deleting %s/%s: %s; a link in the output location is never followed", self.uri,
                        staging, exc)
            return False

    def _promote_local(self, root: Dir, src_key: str, dst_key: str, size: int) -> str:
        try:
            try:
                root.rename(src_key, root, dst_key)
                return "moved"
            except FileNotFoundError:
                pass
            st = root.stat(dst_key)
        except InvalidPath as exc:
            raise self._refused(f"moving {src_key} to {dst_key}", exc) from None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size:
            return "already"  # an earlier commit moved it
        raise SinkError(
            f"staged file {self.uri}/{src_key} is gone and {self.uri}/{dst_key} is "
            f"{'of another size' if st is not None else 'missing'}: the batch's output "
            "is lost; restore from an "
            "earlier checkpoint so that it is produced again"
        )

    def _promote_s3(self, moves: Sequence[tuple[str, str, int]], batch_id: int, txn: str) -> list[str]:
        store = self._storage()

        def copy(move: tuple[str, str, int]) -> str:
            src, dst, size = move
            try:
                store.copy(src, dst)
                return "copied"
            except ObjectNotFound:
                pass
            try:
                if store.stat(dst).size == size:
                    return "already"
            except ObjectNotFound:
                pass
            raise SinkError(
                f"staged object {self.uri}/{src} is gone and {self.uri}/{dst} is not in place: the batch's "
                "output is lost; restore from an earlier checkpoint so that it is produced again"
            )

        if not moves:
            return claims.in_halves(None, copy, moves, batch_id, txn)
        with ThreadPoolExecutor(max_workers=min(COPY_THREADS, len(moves))) as pool:
            states = claims.in_halves(pool, copy, moves, batch_id, txn)
        store.delete(src for src, _dst, _size in moves)
        return states

    def _drop_staging(self, staging: str) -> None:
        if self._local is not None:
            try:
                self._remove_local(staging)
            except OSError as exc:  # leftovers are removed by cleanup_orphans
                log.warning("could not remove %s/%s: %s", self.uri, staging, exc)
        else:
            try:
                self._storage().delete_prefix(staging)
            except StorageError as exc:  # leftovers are removed by cleanup_orphans
                log.warning("could not remove %s/%s: %s", self.uri, staging, exc)

    # -- abort and cleanup ------------------------------------------------------------

    def abort(self, record: TransactionRecord) -> None:
        """Delete the transaction's staging area; files it moved without holding the
        batch's claim (a commit of the previous release that died halfway) are removed
        from the destination too.

        :raises SinkError: the transaction holds its batch's claim: it is committed (an
            unfinished promotion was finished now), it cannot be aborted.
        """
        self._moves(record)
        claims.abort(self, record)

    def staged_transactions(self, job: str) -> list[str]:
        """Transaction ids of `job` that have a staging area under ``_staging/``."""
        if self._local is not None:
            try:
                with self._root() as root:
                    names = root.subdirs(manifests.STAGING)  # staging areas: directories, never links
            except FileNotFoundError:
                return []
            except InvalidPath as exc:
                log.warning("not looking for staging areas in %s: %s; a link in the output location is never "
                            "followed", self.uri, exc)
                return []
        else:
            names = self._storage().list_dirs(manifests.STAGING)
        found = []
        for name in sorted(names):
            parsed = layout.parse_txn_id(name)
            if parsed is not None and parsed[0] == job:
                found.append(name)
        return found

    def cleanup_orphans(self, job: str, keep: set[str], *, upto_generation: int | None = None) -> int:
        """Settle the staging areas of `job` whose transaction is not in `keep`: one that
        holds its batch's claim is finished (its record was cleaned up before its promotion
        was), every other one is deleted. Returns how many were deleted."""
        removed = 0
        for txn in self.staged_transactions(job):
            if not is_orphan(txn, keep, upto_generation):
                continue
            if claims.settle_orphan(self, txn) == "committed":
                log.warning("finished the claimed promotion of %s in %s (its record was gone)", txn, self.uri)
            else:
                removed += 1
        if removed:
            log.info("removed %d orphaned staging area(s) of job %s in %s", removed, job, self.uri)
        return removed
