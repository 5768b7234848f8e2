"""`S3Sink`: exactly-once files under an S3 prefix, with pending multipart uploads as the
pre-commit (no data is copied at commit time).

Transaction of batch N in generation g (``txn = <job>-b<N>-g<g>``)::

    stage    every Spark partition becomes one file, written by the executor with pyarrow
             and uploaded as a multipart upload that is NOT completed: invisible to
             readers (and to ListObjects). Payload: keys, upload ids, part ETags, sizes.
    commit   the batch's claim ``_sparkpoint/manifests/<job>/<N>.json`` is created (If-None-
             Match: exactly one transaction per batch), then CompleteMultipartUpload for
             each file (objects appear atomically, one by one), then the claim is marked
             done. See `_claims` for the protocol and its hard cases.
    abort    AbortMultipartUpload for each file (the bytes are discarded by S3).

A listing shows a batch's files one by one while they are completed; readers that need
whole batches read `S3Sink.committed_files` instead.

Object keys are deterministic per (transaction, partition):
``<prefix>/part-<txn>-<partition>.<ext>``, so a repeated commit is recognised and a
crashed commit can be finished. Credentials reach executors only inside the pickled
task closure: never in Spark conf, records, manifests, logs or ``repr``.

A bucket lifecycle rule ``AbortIncompleteMultipartUpload`` shorter than the time a batch
may wait for its checkpoint (or for the external commit step) would discard staged
output; keep it longer than the commit SLA.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import (
    CommitOutcomeUnknown,
    ConfigError,
    InvalidPath,
    SinkError,
    StorageError,
)
from airflow_sparkpoint.sinks import _claims as claims
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks._s3_stage import (
    FORMATS,
    MAX_PART_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    RESULT_DDL,
    MiB,
    UploadSpec,
    choose_part_size,
    stage_partition,
)
from airflow_sparkpoint.sinks.base import CommitOutcome, StageContext, checked_bucket, is_orphan
from airflow_sparkpoint.storage import split_uri
from airflow_sparkpoint.storage.paths import confine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_sparkpoint.storage.s3 import S3Storage

log = logging.getLogger(__name__)

__all__ = ["MAX_PARTS", "MIN_PART_SIZE", "MiB", "S3Sink", "choose_part_size", "multipart_etag"]

#: concurrent S3 requests per driver commit or abort
COMMIT_THREADS = 16
_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")
_CLIENT_ERRORS_CERTAIN = frozenset({"InvalidPart", "InvalidPartOrder", "EntityTooSmall", "MalformedXML",
                                    "AccessDenied", "InvalidRequest", "NoSuchBucket"})


def multipart_etag(parts: Sequence[Sequence[Any]]) -> str | None:
    """The ETag S3 gives the object completed from `parts` ``[(number, etag), ...]``: the MD5
    of the binary part MD5s plus ``-<count>``; None when the part ETags are not MD5s
    (SSE-KMS, some S3-compatible stores), so only the size can be compared."""
    digests = []
    for _number, etag in parts:
        text = str(etag).strip('"').lower()
        if not _MD5_HEX.match(text):
            return None
        digests.append(bytes.fromhex(text))
    md5 = hashlib.md5(b"".join(digests), usedforsecurity=False)  # S3's ETag algorithm, not security
    return f"{md5.hexdigest()}-{len(digests)}"


def _error_code(exc: BaseException) -> tuple[str, int | None]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


def _is_no_such_upload(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return code == "NoSuchUpload" or (status == 404 and code in ("", "404", "NotFound"))


# -- the sink --------------------------------------------------------------------------


class S3Sink(claims.FileSink):
    """Files under ``s3://bucket/prefix`` (``s3a://`` is an alias), one per Spark partition
    and batch, committed exactly once by completing their multipart uploads.

    :param uri: ``s3://bucket/prefix``; readers see ``part-*.<ext>`` files directly under it.
    :param format: ``parquet`` (snappy), ``json`` (one object per line) or ``csv`` (with header).
    :param part_size: minimum part size in bytes (>= 5 MiB); by default 5 MiB, raised as
        needed to stay within 10,000 parts.
    """

    kind = "s3"

    def __init__(self, uri: str, format: str = "parquet", *, part_size: int | None = None) -> None:
        try:
            scheme, bucket, path = split_uri(uri)
        except InvalidPath as exc:
            raise ConfigError(f"S3Sink uri {uri!r} is invalid: {exc}") from None
        if scheme != "s3":
            raise ConfigError(f"S3Sink uri {uri!r} is not an S3 URI; expected s3://bucket/prefix (or s3a://)")
        checked_bucket(bucket, f"S3Sink uri {uri!r}")
        if format not in FORMATS:
            raise ConfigError(f"S3Sink format {format!r} is not supported; expected one "
                              f"of: {', '.join(FORMATS)}")
        if part_size is not None and (
            isinstance(part_size, bool) or not isinstance(part_size, int)
            or not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE
        ):
            raise ConfigError(
                f"S3Sink part_size {part_size!r} is invalid; expected bytes between {MIN_PART_SIZE} (5 MiB) "
                f"and {MAX_PART_SIZE} (5 GiB), or None to choose it from the data size"
            )
        self.bucket = bucket
        self.prefix, self.uri = manifests.s3_destination(bucket, path)
        self.format = format
        self.part_size = part_size
        self._options: dict[str, Any] = {}
        self._store: S3Storage | None = None

    def __repr__(self) -> str:
        return f"S3Sink({self.uri!r}, format={self.format!r})"

    # -- identity -------------------------------------------------------------------

    def to_config(self) -> dict[str, Any]:
        return {"uri": self.uri, "format": self.format, "part_size": self.part_size}

    def _storage(self) -> S3Storage:
        if self._store is None:
            from airflow_sparkpoint.storage.s3 import S3Storage

            self._store = S3Storage(self.bucket, self.prefix, **self._options)
        return self._store

    @property
    def _client(self) -> Any:
        return self._storage().client

    def validate(self) -> None:
        try:
            self._storage().check()
            self._storage().check_exclusive_create()  # batch claims are conditional creates
        except StorageError as exc:
            raise SinkError(f"S3Sink destination {self.uri} is not usable: {exc}") from None

    # -- stage ----------------------------------------------------------------------

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        if ctx.storage_options:
            self.configure(ctx.storage_options)
        txn = ctx.txn_id
        spec = UploadSpec(self.bucket, self.prefix + manifests.part_prefix(txn), self.format, self.part_size,
                          dict(self._options))

        def stage_batches(batches: Iterator[Any]) -> Iterator[Any]:
            return stage_partition(spec, batches)

        rows = df.mapInArrow(stage_batches, RESULT_DDL).collect()
        uploads = sorted(
            (
                {
                    "key": r["key"],
                    "upload_id": r["upload_id"],
                    "parts": [[p["part_number"], p["etag"]] for p in r["parts"]],
                    "size": int(r["size"]),
                    "rows": int(r["rows"]),
                }
                for r in rows
            ),
            key=lambda u: u["key"],
        )
        # A retried or speculative task, or an earlier attempt of this batch, may have
        # left uploads for this transaction that the payload does not reference.
        stray = self._abort_strays(ctx.job, txn, keep={(u["key"], u["upload_id"]) for u in uploads})
        if stray:
            log.info("aborted %d stray upload(s) of %s under %s", stray, txn, self.uri)
        payload = {
            "format": self.format,
            "uploads": uploads,
            "rows": sum(u["rows"] for u in uploads),
            "bytes": sum(u["size"] for u in uploads),
        }
        log.info("staged %s: %d file(s), %d rows, %d bytes as pending uploads under %s",
                 txn, len(uploads), payload["rows"], payload["bytes"], self.uri)
        faults.pause("staged", ctx.batch_id, txn=txn)
        return payload

    # -- commit ---------------------------------------------------------------------

    def _uploads(self, record: TransactionRecord) -> list[dict[str, Any]]:
        try:
            uploads = record.payload["staged"]["uploads"]
        except (KeyError, TypeError) as exc:
            raise SinkError(
                f"transaction {record.txn_id} has no S3Sink payload ({exc!r}); "
                "expected payload.staged.uploads"
            ) from None
        return self._confined(uploads, record.txn_id, f"transaction {record.txn_id} payload.staged.uploads")

    def _plan_uploads(self, txn: str, plan: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        """The uploads of `txn`'s promotion `plan`, read from a claim or decision in the
        output location (as untrusted as a record): every key one of `txn`'s files."""
        return self._confined((plan or {}).get("uploads", ()), txn,
                              f"the promotion plan of {txn} in {self.uri}: uploads")

    def _confined(self, uploads: Any, txn: str, what: str) -> list[dict[str, Any]]:
        """`uploads` (``{key, upload_id, ...}`` items read from `what`), each key checked to be
        one of transaction `txn`'s files (``<prefix>part-<txn>-<n>.<ext>``, the names its
        executors upload to): a completed or aborted upload is always this transaction's,
        never another one's nor another application's under the prefix or the bucket.

        :raises SinkError: `uploads` is malformed, or a key is not one of `txn`'s files (the
            message names `what` and the key).
        """
        try:
            confined = []
            for upload in uploads:
                # An S3 key is literal: checked as it is (`exact`), never rewritten.
                key = confine(upload["key"], under=self.prefix, what=f"{what}[].key", error=SinkError,
                              exact=True)
                if manifests.part_txn(key[len(self.prefix):]) != txn:
                    raise SinkError(f"{what}[].key {key!r} is not a file of transaction {txn} (expected "
                                    f"{self.prefix}{manifests.part_prefix(txn)}<n>.<ext>); refused")
                confined.append({**upload, "key": key})
            return confined
        except (KeyError, TypeError) as exc:
            raise SinkError(f"{what} are malformed ({exc!r}); expected a list "
                            "of {key, upload_id, ...}") from None

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        """Claim the batch, then complete the transaction's uploads (`_claims`).

        :raises TransactionConflict: another transaction holds the batch; this one's
            pending uploads were aborted.
        :raises SinkError: the transaction was aborted, or an upload is lost.
        :raises CommitOutcomeUnknown: S3 failed midway; run the commit again.
        """
        self._uploads(record)  # a malformed record fails before anything is written
        return claims.commit(self, record)

    # -- what the claim protocol needs (`_claims.FileSink`) -------------------------------

    def _plan(self, record: TransactionRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        uploads = self._uploads(record)
        files = [{"key": u["key"], "size": u["size"], "rows": u.get("rows", 0)} for u in uploads]
        return {"uploads": uploads}, files

    def _missing(self, txn: str, plan: Mapping[str, Any]) -> list[str]:
        uploads = self._plan_uploads(txn, plan)
        if not uploads:
            return []
        parsed = layout.parse_txn_id(txn)
        pending = {(key, upload_id)
                   for _t, key, upload_id in self.pending_uploads(parsed[0] if parsed else txn, txn)}
        gone = [u for u in uploads if (u["key"], u["upload_id"]) not in pending]
        if not gone:
            return []
        with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(gone))) as pool:
            landed = list(pool.map(self._landed, gone))
        return [f"s3://{self.bucket}/{u['key']} (upload {u['upload_id']})"
                for u, there in zip(gone, landed, strict=True) if not there]

    def _promote(self, claim: Mapping[str, Any]) -> list[str]:
        batch, txn = int(claim["batch_id"]), str(claim["txn_id"])
        uploads = self._plan_uploads(txn, claim["plan"])
        if not uploads:
            return claims.in_halves(None, self._complete, uploads, batch, txn)
        with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(uploads))) as pool:
            return claims.in_halves(pool, self._complete, uploads, batch, txn)

    def _discard(self, txn: str, plan: Mapping[str, Any] | None, *, promoted_too: bool) -> int:
        parsed = layout.parse_txn_id(txn)
        job = parsed[0] if parsed else txn
        self._plan_uploads(txn, plan)  # a plan naming anything but txn's files is refused
        if (plan or {}).get("listed"):  # the caller just listed every pending upload of it
            aborted = self._abort_all([(u["key"], u["upload_id"]) for u in self._plan_uploads(txn, plan)])
        else:
            # Only uploads proven to be txn's: listed by S3 as pending under txn's own file
            # names (the plan's are among them), never an upload id a record or claim names.
            aborted = self._abort_strays(job, txn)
        if promoted_too:
            partial = self._objects_of(txn)
            if partial:
                log.warning("abort of %s removes %d object(s) completed without a claim from %s",
                            txn, len(partial), self.uri)
                try:
                    self._storage().delete(partial)
                except StorageError as exc:
                    raise SinkError(f"cannot delete the partial output of {txn}: {exc}") from None
        return aborted

    def _after_done(self, claim: Mapping[str, Any]) -> None:
        """Nothing to clean: completed uploads leave nothing staged."""

    def _file_uri(self, file: Mapping[str, Any]) -> str:
        key = confine(file.get("key"), under=self.prefix, what=f"a claim's file in {self.uri}",
                      error=SinkError)
        return f"s3://{self.bucket}/{key}"

    def _complete(self, upload: Mapping[str, Any]) -> str:
        """Complete one pending upload: "completed" now, or "already" complete.

        :raises SinkError: it certainly failed (upload gone and object absent, or refused).
        :raises CommitOutcomeUnknown: the outcome could not be established.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        key, upload_id = upload["key"], upload["upload_id"]
        parts = [{"PartNumber": int(n), "ETag": str(e)} for n, e in upload["parts"]]
        try:
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
            return "completed"
        except (ClientError, BotoCoreError) as exc:
            failure: BaseException = exc
        where = f"s3://{self.bucket}/{key}"
        try:
            if self._landed(upload):
                return "already"
            alive = self._upload_exists(key, upload_id)
        except (ClientError, BotoCoreError) as exc:
            raise CommitOutcomeUnknown(
                f"completing {where} failed ({failure}) and its state cannot be read ({exc}); "
                "keep the staged upload and run the commit again"
            ) from None
        if not alive:
            raise SinkError(
                f"the staged upload of {where} no longer exists and the object is not there (aborted, or "
                "expired by a bucket lifecycle rule): this batch's output is lost; restore from an earlier "
                "checkpoint so that the batch is produced again"
            )
        code, status = _error_code(failure)
        if code in _CLIENT_ERRORS_CERTAIN or (status is not None and 400 <= status < 500):
            raise SinkError(f"completing {where} was refused: {code or status}: {failure}")
        raise CommitOutcomeUnknown(f"completing {where} failed ({failure}); the upload is "
                                   "kept, run the commit again")

    def _landed(self, upload: Mapping[str, Any]) -> bool:
        """Whether the object of `upload` exists with the expected size (and ETag)."""
        from botocore.exceptions import ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=upload["key"])
        except ClientError as exc:
            code, status = _error_code(exc)
            if status == 404 or code in ("NoSuchKey", "NotFound", "404"):
                return False
            raise
        if int(head.get("ContentLength", -1)) != int(upload["size"]):
            return False
        expected = multipart_etag(upload["parts"])
        return expected is None or str(head.get("ETag", "")).strip('"') == expected

    def _upload_exists(self, key: str, upload_id: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.list_parts(Bucket=self.bucket, Key=key, UploadId=upload_id, MaxParts=1)
        except ClientError as exc:
            if _is_no_such_upload(exc):
                return False
            raise
        return True

    # -- abort and cleanup ------------------------------------------------------------

    def abort(self, record: TransactionRecord) -> None:
        """Abort the transaction's pending uploads (missing ones are fine); objects it
        completed without holding the batch's claim (a commit of the previous release
        that died halfway) are deleted too.

        :raises SinkError: the transaction holds its batch's claim: it is committed (an
            unfinished promotion was finished now), it cannot be aborted.
        """
        self._uploads(record)
        claims.abort(self, record)

    def _objects_of(self, txn: str) -> list[str]:
        """Keys (relative to the prefix) of completed objects of transaction `txn`."""
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self._client.get_paginator("list_objects_v2")
        keys = []
        try:
            for page in paginator.paginate(Bucket=self.bucket,
                                           Prefix=self.prefix + manifests.part_prefix(txn)):
                for item in page.get("Contents", ()):
                    rel = item["Key"][len(self.prefix):]
                    if manifests.part_txn(rel) == txn:
                        keys.append(rel)
        except (ClientError, BotoCoreError) as exc:
            raise SinkError(f"cannot list s3://{self.bucket}/{self.prefix}part-{txn}-*: {exc}") from None
        return keys

    def _abort_upload(self, key: str, upload_id: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if _is_no_such_upload(exc):
                return False
            raise SinkError(f"cannot abort upload {upload_id} of s3://{self.bucket}/{key}: {exc}") from None
        except BotoCoreError as exc:
            raise SinkError(f"cannot abort upload {upload_id} of s3://{self.bucket}/{key}: {exc}") from None
        return True

    def pending_uploads(self, job: str, txn: str | None = None) -> list[tuple[str, str, str]]:
        """``(txn id, key, upload id)`` of every pending upload of `job` (or of its
        transaction `txn` only) under the prefix (ListMultipartUploads, followed past its
        1,000-upload pages)."""
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self._client.get_paginator("list_multipart_uploads")
        found = []
        try:
            for page in paginator.paginate(Bucket=self.bucket,
                                           Prefix=self.prefix + manifests.part_prefix(txn or job)):
                for item in page.get("Uploads", ()):
                    found_txn = manifests.part_txn(item["Key"][len(self.prefix):])
                    if found_txn is None:
                        continue
                    parsed = layout.parse_txn_id(found_txn)
                    if parsed is not None and parsed[0] == job and txn in (None, found_txn):
                        found.append((found_txn, item["Key"], item["UploadId"]))
        except (ClientError, BotoCoreError) as exc:
            raise SinkError(f"cannot list pending uploads under {self.uri}: {exc}") from None
        return found

    def _abort_all(self, uploads: Sequence[tuple[str, str]]) -> int:
        """Abort ``(key, upload id)`` pairs concurrently; return how many were still pending."""
        if not uploads:
            return 0
        with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(uploads))) as pool:
            return sum(pool.map(lambda u: self._abort_upload(*u), uploads))

    def _abort_strays(self, job: str, txn: str, keep: AbstractSet[tuple[str, str]] = frozenset()) -> int:
        """Abort the pending uploads of transaction `txn` other than the pairs in `keep`."""
        return self._abort_all([
            (key, upload_id) for _txn, key, upload_id in self.pending_uploads(job, txn)
            if (key, upload_id) not in keep
        ])

    def cleanup_orphans(self, job: str, keep: set[str], *, upto_generation: int | None = None) -> int:
        """Settle the pending uploads of `job` under the prefix whose transaction is not in
        `keep`: a transaction that holds its batch's claim is finished (its record was
        cleaned up before its promotion was), every other one is aborted. Returns how many
        uploads were aborted."""
        listed: dict[str, list[dict[str, str]]] = {}
        for txn, key, upload_id in self.pending_uploads(job):
            if is_orphan(txn, keep, upto_generation):
                listed.setdefault(txn, []).append({"key": key, "upload_id": upload_id})
        txns = sorted(listed)
        if not txns:
            return 0

        def settle(txn: str) -> str:
            return claims.settle_orphan(self, txn, {"uploads": listed[txn], "listed": True})

        with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(txns))) as pool:
            outcomes = list(pool.map(settle, txns))
        aborted = sum(len(listed[t]) for t, outcome in zip(txns, outcomes, strict=True)
                      if outcome == "discarded")
        finished = [t for t, outcome in zip(txns, outcomes, strict=True) if outcome == "committed"]
        if finished:
            log.warning("finished the claimed promotion of %s under %s (their records were gone)", finished,
                        self.uri)
        if aborted:
            log.info("aborted %d orphaned upload(s) of job %s under %s", aborted, job, self.uri)
        return aborted
