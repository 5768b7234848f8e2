"""S3 (and S3-compatible: MinIO, moto, Ceph) `Storage` on boto3.

Atomicity comes from S3 itself: a PutObject, CopyObject or CompleteMultipartUpload makes
the whole object visible at once, and ``If-None-Match: *`` makes `put_if_absent` a
server-side create-if-absent that is atomic across processes and machines.

Failures are mapped onto the project's error tree::

    NoSuchKey / 404 on an object            ObjectNotFound
    412 PreconditionFailed (put_if_absent)  ObjectExists
    NoSuchBucket / 404 / 403 on the bucket  StorageError  "bucket 'x' does not exist or ..."
    connection refused, DNS, timeouts       StorageError  "S3 endpoint ... is unreachable"
    anything else                           StorageError  naming the operation and s3:// URI

Throttling and 5xx answers are retried by botocore (``adaptive`` retry mode, up to
`max_attempts` attempts in total) before any of this happens.
"""

from __future__ import annotations

import builtins
import logging
import os
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from airflow_sparkpoint.exceptions import ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage.base import ObjectInfo, Storage, check_size, discard_file, normalize_prefix
from airflow_sparkpoint.storage.redact import redact_url
from airflow_sparkpoint.storage.s3_client import (  # re-exported: callers import them from here
    MAX_COPY_OBJECT_SIZE,
    S3Connection,
    validate_bucket_name,
)
from airflow_sparkpoint.storage.uri import split_uri

log = logging.getLogger(__name__)

__all__ = ["MAX_COPY_OBJECT_SIZE", "S3Storage", "validate_bucket_name"]

#: files up to this size move in one GET or PutObject; above it, by boto3's managed
#: multipart transfer, whose threshold and part size it is
_SINGLE_REQUEST_MAX = 64 * 1024**2
_READ_CHUNK = 1024**2
#: DeleteObjects accepts at most this many keys per request
DELETE_BATCH = 1000

_CONFLICT_RETRIES = 5
_BODY_RETRIES = 2
# (endpoint, bucket) pairs whose conditional writes were probed in this process
_EXCLUSIVE_CREATE_OK: set[tuple[str, str]] = set()


class _FirstBytes:
    """The first `size` bytes of an open file as a seekable PUT body. The request
    announces `size` (botocore measures a body by seeking to its end); a file that grew
    meanwhile (Spark writes some in place) must not send more than that, which would
    leave the kept-alive connection out of step. botocore rewinds it to retry."""

    def __init__(self, handle: Any, size: int) -> None:
        self._handle = handle
        self._size = size
        self._pos = 0
        handle.seek(0)

    def read(self, amount: int | None = -1) -> bytes:
        left = self._size - self._pos
        amount = left if amount is None or amount < 0 else min(amount, left)
        data = self._handle.read(amount) if amount else b""
        self._pos += len(data)
        return bytes(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, min(base + offset, self._size))
        self._handle.seek(self._pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return self._size


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix``: the `Storage` operations, on the bucket's
    `S3Connection` (`connection`: settings, client, keys under the prefix, the bucket
    check, error translation), which the store holds.

    The boto3 client is created on first use (a store can be built, and pickled, where
    no network is reachable) and then shared: boto3 clients are thread-safe, sessions
    are not, so each store owns a private session used only to build its client. Pass
    `client` to share one client between stores (the store then never closes it).

    Call `check` before writing anything to fail fast on a wrong bucket, bad
    credentials or an unreachable endpoint.

    :param bucket: the bucket (validated against the S3 naming rules: `InvalidPath`).
    :param prefix: the key prefix every key of this store lives under.
    :param endpoint_url: an S3-compatible endpoint (MinIO, moto); path-style addressing
        is used for it unless `addressing_style` says otherwise.
    :param max_attempts: attempts per request in total, first try included (1 = never
        retry); throttling, 5xx and connection errors are retried with adaptive backoff.
    :param connect_timeout, read_timeout: socket timeouts in seconds.
    :param config: a ``botocore.config.Config`` merged over the defaults built here.
    :raises InvalidPath: the bucket name or `endpoint_url` is invalid.
    :raises ConfigError: `max_attempts` or `addressing_style` is invalid.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        client: Any = None,
        max_attempts: int = 8,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_pool_connections: int = 32,
        addressing_style: str | None = None,
        config: Any = None,
    ) -> None:
        #: the bucket and prefix as reached through boto3: settings, client, keys, errors
        self.connection = S3Connection(
            bucket, prefix, endpoint_url=endpoint_url, region_name=region_name,
            aws_access_key_id=aws_access_key_id, aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token, client=client, max_attempts=max_attempts,
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            max_pool_connections=max_pool_connections, addressing_style=addressing_style, config=config,
        )
        self.uri = self.connection.uri
        self._max_copy_object_size = MAX_COPY_OBJECT_SIZE
        self._copy_chunksize = 256 * 1024**2

    def __repr__(self) -> str:
        endpoint = self.connection.endpoint_url
        shown = f", endpoint_url={redact_url(endpoint)!r}" if endpoint else ""
        return f"S3Storage({self.uri!r}{shown})"

    @property
    def bucket(self) -> str:
        return self.connection.bucket

    @property
    def prefix(self) -> str:
        """The key prefix (``""`` or ending with ``/``)."""
        return self.connection.prefix

    @property
    def endpoint_url(self) -> str | None:
        return self.connection.endpoint_url

    @property
    def region_name(self) -> str | None:
        return self.connection.region_name

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use, thread-safe)."""
        return self.connection.client

    def check(self) -> None:
        """Fail fast unless the bucket exists and these credentials may use it (HeadBucket).

        :raises StorageError: the endpoint is unreachable, the bucket is missing or not
            accessible, or it lives in another region than the client's.
        """
        self.connection.check()

    def check_exclusive_create(self) -> None:
        """Fail fast unless the endpoint honours ``If-None-Match: *`` on PutObject: a second
        create of one key must be refused. Generation claims and the sinks' batch claims
        rest on it; an S3-compatible server that ignores the header would let two drivers
        both win. Probed once per endpoint and bucket in this process (two PUTs, a DELETE).

        :raises StorageError: the endpoint overwrote the probe instead of refusing it, or
            the probe could not be written.
        """
        where = (self.endpoint_url or "AWS S3", self.bucket)
        if where in _EXCLUSIVE_CREATE_OK:
            return
        probe = f"_sparkpoint_probe/{uuid.uuid4().hex}"
        self.put_if_absent(probe, b"1")
        try:
            self.put_if_absent(probe, b"2")
        except ObjectExists:
            _EXCLUSIVE_CREATE_OK.add(where)
            return
        finally:
            self.delete([probe])
        raise StorageError(
            f"S3 endpoint {self.connection.endpoint} (bucket {self.bucket!r}) does not honour conditional "
            "writes (PutObject with If-None-Match: * overwrote an existing object); Sparkpoint's generation "
            "and batch claims need them (AWS S3, MinIO, SeaweedFS and Ceph RGW recent releases have them)"
        )

    # -- objects ----------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self.connection.full_key(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data))
        except (ClientError, BotoCoreError) as exc:
            raise self.connection.error(exc, "PutObject", full) from exc

    def put_if_absent(self, key: str, data: bytes) -> None:
        """PutObject with ``If-None-Match: *``.

        A 412 means the key exists: `ObjectExists`. A 409 (a concurrent conditional write
        on the same key was in flight) is retried as AWS asks; the retry then either wins
        or sees the other writer's object (412). When botocore had to retry the request
        itself (a lost response, a 5xx), a 412 may be our own first attempt having landed:
        then the stored bytes are compared with ours and equal bytes count as success.
        """
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        full = self.connection.full_key(key)
        body = bytes(data)
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=body, IfNoneMatch="*")
                return
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                meta = exc.response.get("ResponseMetadata", {})
                status = meta.get("HTTPStatusCode")
                if code == "PreconditionFailed" or status == 412:
                    if meta.get("RetryAttempts", 0) and self._holds(full, body):
                        log.info("put_if_absent of %s: an earlier attempt of this call created it", full)
                        return
                    raise ObjectExists(f"{self.connection.uri_of(full)} already exists") from None
                if code == "ConditionalRequestConflict" or status == 409:
                    if attempt < _CONFLICT_RETRIES:
                        time.sleep(random.uniform(0, 0.05 * 2**attempt))
                        continue
                    raise StorageError(
                        f"S3 PutObject (If-None-Match) of {self.connection.uri_of(full)} kept conflicting "
                        f"with concurrent writes ({_CONFLICT_RETRIES + 1} attempts); the object was not "
                        "created by this call"
                    ) from exc
                raise self.connection.error(exc, "PutObject (If-None-Match)", full) from exc
            except BotoCoreError as exc:
                error = self.connection.error(exc, "PutObject (If-None-Match)", full)
                if not isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, NoCredentialsError)):
                    # the request may have reached S3: do not let the caller assume either way
                    error = StorageError(f"{error}; the object may or may not have been created: read it")
                raise error from exc

    def _holds(self, full: str, body: bytes) -> bool:
        try:
            return self._get_full(full) == body
        except ObjectNotFound:
            return False

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return self._get_full(self.connection.full_key(key), max_bytes)

    def _get_full(self, full: str, max_bytes: int | None = None) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(_BODY_RETRIES + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except (ClientError, BotoCoreError) as exc:
                raise self.connection.error(exc, "GetObject", full) from exc
            self.connection.bucket_verified = True
            where = f"s3://{self.bucket}/{full}"
            try:
                with response["Body"] as body:  # over the limit: closed unread
                    check_size(int(response.get("ContentLength") or 0), max_bytes, where)
                    data: bytes = body.read() if max_bytes is None else body.read(max_bytes + 1)
                check_size(len(data), max_bytes, where)
                return data
            except BotoCoreError as exc:  # the connection broke mid-body: botocore does not retry that
                if attempt == _BODY_RETRIES:
                    raise self.connection.error(exc, "GetObject (reading the body)", full) from exc
                log.warning("GetObject of %s: body read failed (%s); retrying", full, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def stat(self, key: str) -> ObjectInfo:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self.connection.full_key(key)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=full)
        except (ClientError, BotoCoreError) as exc:
            raise self.connection.missing(exc, "HeadObject", full) from exc
        self.connection.bucket_verified = True
        return ObjectInfo(
            key=self.connection.relative_key(full),
            size=int(head["ContentLength"]),
            mtime=head["LastModified"].timestamp(),
            etag=str(head.get("ETag", "")).strip('"') or None,
        )

    # -- listing ----------------------------------------------------------------------

    def _pages(self, op: str, full_prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self.client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=full_prefix, **kwargs))
        while True:
            try:
                page = next(pages)
            except StopIteration:
                return
            except (ClientError, BotoCoreError) as exc:
                raise self.connection.error(exc, op, full_prefix or None) from exc
            self.connection.bucket_verified = True
            yield page

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects page by page (ListObjectsV2, 1,000 keys per request): the next
        page is only requested when the caller iterates past the current one."""
        full_prefix = self.prefix + normalize_prefix(prefix)
        for page in self._pages("ListObjectsV2", full_prefix):
            for item in page.get("Contents", ()):
                full = item["Key"]
                if full.endswith("/"):  # a "folder" marker made by a console or another tool
                    continue
                yield ObjectInfo(
                    key=self.connection.relative_key(full),
                    size=int(item.get("Size", 0)),
                    mtime=item["LastModified"].timestamp(),
                    etag=str(item.get("ETag", "")).strip('"') or None,
                )

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        full_prefix = self.prefix + normalize_prefix(prefix)
        names: set[str] = set()
        for page in self._pages("ListObjectsV2 (delimiter)", full_prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(full_prefix):].rstrip("/")
                if name:
                    names.add(name)
        return sorted(names)

    # -- delete and copy --------------------------------------------------------------

    def delete(self, keys: Iterable[str]) -> None:
        """DeleteObjects in batches of 1,000 (quiet mode: only failures come back).

        Every key is validated before the first request. Missing keys are no-ops (S3
        reports them as deleted). Per-key failures are collected over all batches and
        raised together as one `StorageError`.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        full_keys = builtins.list(dict.fromkeys(self.connection.full_key(k) for k in keys))
        failures: builtins.list[str] = []
        for start in range(0, len(full_keys), DELETE_BATCH):
            batch = full_keys[start:start + DELETE_BATCH]
            try:
                response = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except (ClientError, BotoCoreError) as exc:
                raise self.connection.error(exc, f"DeleteObjects ({len(batch)} keys)", batch[0]) from exc
            for err in response.get("Errors", ()):
                reason = f"{err.get('Code')} {err.get('Message', '')}".rstrip()
                failures.append(f"{self.connection.uri_of(err.get('Key'))}: {reason}")
        if failures:
            shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
            raise StorageError(f"S3 DeleteObjects in {self.uri} failed for {len(failures)} key(s): {shown}")

    def copy(self, src: str, dst: str) -> None:
        """Server-side copy: one CopyObject, or a multipart UploadPartCopy (boto3's
        managed copy) when the source is larger than CopyObject allows (5 GiB)."""
        self._server_copy(self, src, dst)

    def at(self, uri: str) -> Storage | None:
        """The bucket and prefix `uri` names on this store's service, reached with its
        endpoint, credentials and client (`S3Connection.sibling`), or None for another scheme.

        :raises InvalidPath: `uri` or its bucket name is malformed.
        """
        scheme, bucket, path = split_uri(uri)
        if scheme != "s3":
            return None
        other = object.__new__(S3Storage)
        other.__dict__.update(self.__dict__)
        other.connection = self.connection.sibling(bucket, path)
        other.uri = other.connection.uri
        return other

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        """A server-side copy when `source` is a bucket of the same S3 service reached
        with the same credentials (any bucket of it: CopyObject names the source's)."""
        store, source_key = source.locate(key)
        if not isinstance(store, S3Storage) or not self.connection.same_service(store.connection):
            return False
        self._server_copy(store, source_key, target_key)
        return True

    def _server_copy(self, store: S3Storage, src: str, dst: str) -> None:
        """Copy `src` of `store` (this store or another bucket of its service) to `dst`;
        errors name the source object."""
        from botocore.exceptions import BotoCoreError, ClientError

        full_src, full_dst = store.connection.full_key(src), self.connection.full_key(dst)
        source = {"Bucket": store.bucket, "Key": full_src}
        try:
            self.client.copy_object(Bucket=self.bucket, Key=full_dst, CopySource=source)
            return
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("InvalidRequest", "EntityTooLarge"):
                raise store.connection.missing(exc, "CopyObject", full_src) from exc
            refused = exc
        except BotoCoreError as exc:
            raise store.connection.error(exc, "CopyObject", full_src) from exc
        size = store.stat(src).size
        if size <= self._max_copy_object_size:  # refused for another reason than its size
            raise store.connection.error(refused, "CopyObject", full_src) from refused
        log.debug("copying %s (%d bytes) to %s with multipart UploadPartCopy", full_src, size, full_dst)
        try:
            config = self._transfer_config(self._max_copy_object_size)
            self.client.copy(source, self.bucket, full_dst, Config=config)
        except Exception as exc:
            raise store.connection.missing(self._unwrap(exc), "multipart copy", full_src) from exc

    # -- files ------------------------------------------------------------------------

    def _transfer_config(self, threshold: int | None = None) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=threshold if threshold is not None else _SINGLE_REQUEST_MAX,
            multipart_chunksize=self._copy_chunksize if threshold is not None else _SINGLE_REQUEST_MAX,
            max_concurrency=8,
            preferred_transfer_client="classic",
        )

    @staticmethod
    def _unwrap(exc: BaseException) -> BaseException:
        """boto3 wraps ClientErrors of managed transfers (S3UploadFailedError, ...)."""
        from botocore.exceptions import BotoCoreError, ClientError

        inner: BaseException | None = exc
        while inner is not None and not isinstance(inner, (ClientError, BotoCoreError)):
            inner = inner.__cause__ or inner.__context__
        return inner if inner is not None else exc

    def upload_file(self, local_path: str, key: str) -> None:
        """Streamed upload: one PutObject of the file's bytes when it is opened, up to 64
        MiB, boto3's managed multipart upload above; the object appears only when
        complete. A managed upload starts a thread pool per file, ≈ 3 ms more than the
        PUT for each of the few small files of a checkpoint.

        :raises ObjectNotFound: `local_path` is not a file.
        :raises StorageError: the file cannot be read or the upload failed.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        full = self.connection.full_key(key)
        if not os.path.isfile(local_path):
            raise ObjectNotFound(f"{local_path} does not exist or is not a file")
        try:
            with open(local_path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size <= _SINGLE_REQUEST_MAX:
                    try:
                        self.client.put_object(Bucket=self.bucket, Key=full, Body=_FirstBytes(handle, size))
                    except (ClientError, BotoCoreError) as exc:
                        raise self.connection.error(exc, "PutObject", full) from exc
                    return
        except FileNotFoundError:
            raise ObjectNotFound(f"{local_path} does not exist or is not a file") from None
        except OSError as exc:
            raise StorageError(f"cannot read {local_path} to upload it to "
                               f"{self.connection.uri_of(full)}: {exc}") from None
        try:
            self.client.upload_file(local_path, self.bucket, full, Config=self._transfer_config())
        except Exception as exc:
            raise self.connection.error(self._unwrap(exc), "upload", full) from exc

    def download_file(self, key: str, local_path: str) -> None:
        """Streamed download into a temp file renamed into place on success: one GET, its
        body written as it arrives (a read cut short is retried up to `max_attempts`);
        above the multipart threshold boto3's managed download, whose parallel ranged
        GETs pay off there but cost a HEAD and a thread pool per file below it."""
        from botocore.exceptions import BotoCoreError, ClientError

        full = self.connection.full_key(key)
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        tmp = f"{local_path}.sparkpoint-tmp-{uuid.uuid4().hex}"
        for attempt in range(1, self.connection.max_attempts + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                raise self.connection.missing(exc, "download", full) from exc
            except BotoCoreError as exc:
                raise self.connection.error(exc, "download", full) from exc
            body = response["Body"]
            if int(response.get("ContentLength") or 0) > _SINGLE_REQUEST_MAX:
                body.close()
                try:
                    self.client.download_file(self.bucket, full, local_path, Config=self._transfer_config())
                except Exception as exc:
                    raise self.connection.missing(self._unwrap(exc), "download", full) from exc
                return
            try:
                with open(tmp, "wb") as handle:
                    handle.writelines(body.iter_chunks(_READ_CHUNK))
                os.replace(tmp, local_path)
                return
            except BotoCoreError as exc:  # the connection broke or stalled mid-body
                discard_file(tmp)
                if attempt == self.connection.max_attempts:
                    raise self.connection.error(exc, "download", full) from exc
                log.debug("download of %s cut short (attempt %d): %s; reading it again", full, attempt, exc)
            except BaseException:
                discard_file(tmp)
                raise

    def close(self) -> None:
        """Close the connection pool of the client this store created (it is rebuilt on
        next use); a client passed in by the caller is left alone."""
        self.connection.close()

