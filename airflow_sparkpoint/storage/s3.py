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
import ipaddress
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage.base import (
    ObjectInfo,
    Storage,
    check_size,
    discard_file,
    normalize_key,
    normalize_prefix,
)

log = logging.getLogger(__name__)

__all__ = ["S3Storage", "validate_bucket_name"]

#: the largest object a single CopyObject may copy; bigger ones go through UploadPartCopy
MAX_COPY_OBJECT_SIZE = 5 * 1024**3
#: objects up to this size are downloaded with one GET (boto3's multipart threshold here)
_SINGLE_GET_MAX = 64 * 1024**2
_READ_CHUNK = 1024**2
#: DeleteObjects accepts at most this many keys per request
DELETE_BATCH = 1000

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_BUCKET_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_BUCKET_MISSING_CODES = frozenset({"NoSuchBucket"})
_ACCESS_CODES = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled"})
_CONFLICT_RETRIES = 5
_BODY_RETRIES = 2
# (endpoint, bucket) pairs whose conditional writes were probed in this process
_EXCLUSIVE_CREATE_OK: set[tuple[str, str]] = set()


def validate_bucket_name(bucket: str) -> str:
    """Return `bucket` if it follows the S3 bucket naming rules.

    :raises InvalidPath: the name cannot be an S3 bucket (the message says why).
    """
    expected = "expected 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter/digit"
    if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
        raise InvalidPath(f"S3 bucket name {bucket!r} is invalid; {expected}")
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        raise InvalidPath(f"S3 bucket name {bucket!r} is invalid; '.' may not be next to '.' or '-'")
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        pass
    else:
        raise InvalidPath(f"S3 bucket name {bucket!r} is invalid; it must not look like an IP address")
    if bucket.startswith(_BUCKET_BAD_PREFIXES) or bucket.endswith(_BUCKET_BAD_SUFFIXES):
        raise InvalidPath(f"S3 bucket name {bucket!r} uses a prefix or suffix reserved by AWS; {expected}")
    return bucket


def _redact_url(url: str) -> str:
    """`url` without any ``user:password@`` part."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid endpoint>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix``.

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
        self.bucket = validate_bucket_name(bucket)
        self.prefix = normalize_prefix(prefix)
        if endpoint_url is not None:
            parts = urlsplit(endpoint_url) if isinstance(endpoint_url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                shown = _redact_url(endpoint_url) if isinstance(endpoint_url, str) else repr(endpoint_url)
                raise InvalidPath(f"S3 endpoint_url {shown!r} is invalid; expected http(s)://host[:port]")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"S3 max_attempts={max_attempts!r} is invalid; expected an integer >= 1")
        if addressing_style not in (None, "auto", "path", "virtual"):
            raise ConfigError(
                f"S3 addressing_style={addressing_style!r} is invalid; expected auto, path or virtual"
            )
        self.uri = f"s3://{self.bucket}/{self.prefix.rstrip('/')}" if self.prefix else f"s3://{self.bucket}"
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self._credentials = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        self._max_attempts = max_attempts
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_pool_connections = max_pool_connections
        # Custom endpoints (MinIO, moto, on-prem) rarely resolve bucket.host names.
        self._addressing_style = addressing_style or ("path" if endpoint_url else "auto")
        self._extra_config = config
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()
        self._bucket_verified = False
        self._max_copy_object_size = MAX_COPY_OBJECT_SIZE
        self._copy_chunksize = 256 * 1024**2

    # -- plumbing ---------------------------------------------------------------------

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={_redact_url(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"S3Storage({self.uri!r}{endpoint})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        if state["_owns_client"]:
            state["_client"] = None
        else:  # a caller's client cannot travel; the copy builds its own from the settings
            state["_client"], state["_owns_client"] = None, True
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use, thread-safe)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
                client = self._client
        return client

    def _make_client(self) -> Any:
        import boto3.session
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        config = Config(
            # botocore's "max_attempts" counts retries; "total_max_attempts" counts the first
            # try too, which is what our `max_attempts` means (1 = never retry).
            retries={"total_max_attempts": self._max_attempts, "mode": "adaptive"},
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            max_pool_connections=self._max_pool_connections,
            s3={"addressing_style": self._addressing_style},
        )
        if self._extra_config is not None:
            config = config.merge(self._extra_config)
        key_id, secret, token = self._credentials
        try:
            session = boto3.session.Session(
                aws_access_key_id=key_id,
                aws_secret_access_key=secret,
                aws_session_token=token,
                region_name=self.region_name,
            )
            # botocore never uses a URL's user:password (S3 requests are signed) but quotes the
            # URL in its errors, which then reach tracebacks: the client never sees it.
            endpoint = _redact_url(self.endpoint_url) if self.endpoint_url else None
            return session.client("s3", endpoint_url=endpoint, config=config)
        except (BotoCoreError, ValueError) as exc:
            message = f"cannot create an S3 client for {self.uri} at {self._endpoint}: {exc}"
            raise StorageError(self._scrub(message)) from None

    @property
    def _endpoint(self) -> str:
        client = self._client
        if client is not None:
            try:
                return _redact_url(str(client.meta.endpoint_url))
            except AttributeError:  # pragma: no cover - a foreign client object
                pass
        if self.endpoint_url:
            return _redact_url(self.endpoint_url)
        return "the default AWS S3 endpoint"

    def _full(self, key: str) -> str:
        return self.prefix + normalize_key(key)

    def _rel(self, full_key: str) -> str:
        return full_key[len(self.prefix):]

    def _uri(self, full_key: str | None) -> str:
        return f"s3://{self.bucket}/{full_key}" if full_key else self.uri

    def _scrub(self, message: str) -> str:
        """Remove secrets from `message`: the secret key and session token (botocore never
        puts them in errors, but a server message might echo them) and any
        ``user:password@`` of the endpoint URL (botocore's connection errors quote it)."""
        if self.endpoint_url:
            userinfo = urlsplit(self.endpoint_url).netloc.rpartition("@")[0]
            if userinfo:
                message = message.replace(userinfo + "@", "")
                message = message.replace(userinfo, "***")
        for secret in self._credentials[1:]:
            if secret:
                message = message.replace(secret, "***")
        return message

    def _error(self, exc: BaseException, op: str, full_key: str | None = None) -> StorageError:
        """Translate a botocore/boto3 exception into the project's error tree."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )

        target = self._uri(full_key)
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = str(error.get("Message", "")) or str(exc)
            if code in _BUCKET_MISSING_CODES:
                return self._bucket_error(op, target, code)
            if code in _NOT_FOUND_CODES or status == 404:
                return ObjectNotFound(f"{target} does not exist")
            if code in _ACCESS_CODES or status == 403:
                return StorageError(
                    self._scrub(
                        f"S3 {op} of {target} at {self._endpoint} was denied ({code or status}); "
                        "check the credentials and the bucket policy"
                    )
                )
            return StorageError(
                self._scrub(
                    f"S3 {op} of {target} at {self._endpoint} failed: {code} (HTTP {status}): {message}"
                )
            )
        if isinstance(exc, (ConnectionError, HTTPClientError)):
            return StorageError(
                self._scrub(f"S3 {op} of {target} failed: endpoint {self._endpoint} is unreachable: {exc}")
            )
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"S3 {op} of {target} failed: no AWS credentials found; pass aws_access_key_id/"
                "aws_secret_access_key, or configure the environment, ~/.aws or an instance role"
            )
        if isinstance(exc, BotoCoreError):
            return StorageError(self._scrub(f"S3 {op} of {target} at {self._endpoint} failed: {exc}"))
        return StorageError(self._scrub(f"S3 {op} of {target} failed: {type(exc).__name__}: {exc}"))

    def _bucket_error(self, op: str, target: str, code: str) -> StorageError:
        return StorageError(
            f"bucket {self.bucket!r} does not exist or is not accessible at {self._endpoint} "
            f"({op} of {target}: {code}); create it or fix spark.sparkpoint.dir / the credentials"
        )

    def _missing(self, exc: BaseException, op: str, full_key: str) -> StorageError:
        """Map a 404 from an object request; a bare 404 (HEAD has no body) could also mean
        a missing bucket, so the bucket is checked once per store before blaming the key."""
        error = self._error(exc, op, full_key)
        if isinstance(error, ObjectNotFound) and not self._bucket_verified:
            self.check()
        return error

    # -- reachability -----------------------------------------------------------------

    def check(self) -> None:
        """Fail fast unless the bucket exists and these credentials may use it (HeadBucket).

        :raises StorageError: the endpoint is unreachable, the bucket is missing or not
            accessible, or it lives in another region than the client's.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            meta = exc.response.get("ResponseMetadata", {})
            status = meta.get("HTTPStatusCode")
            region = (meta.get("HTTPHeaders") or {}).get("x-amz-bucket-region")
            if status == 301 and region:
                raise StorageError(
                    f"bucket {self.bucket!r} is in region {region!r}, not {self.client.meta.region_name!r}; "
                    f"set region_name={region!r} (spark.sparkpoint.s3.region)"
                ) from None
            if status in (403, 404) or code in _BUCKET_MISSING_CODES | _ACCESS_CODES | _NOT_FOUND_CODES:
                raise self._bucket_error("HeadBucket", self.uri, code or str(status)) from None
            raise self._error(exc, "HeadBucket") from exc
        except BotoCoreError as exc:
            raise self._error(exc, "HeadBucket") from exc
        self._bucket_verified = True

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
            f"S3 endpoint {self._endpoint} (bucket {self.bucket!r}) does not honour conditional writes "
            "(PutObject with If-None-Match: * overwrote an existing object); Sparkpoint's generation and "
            "batch claims need them (AWS S3, MinIO, SeaweedFS and Ceph RGW recent releases have them)"
        )

    # -- objects ----------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._full(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "PutObject", full) from exc

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

        full = self._full(key)
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
                    raise ObjectExists(f"{self._uri(full)} already exists") from None
                if code == "ConditionalRequestConflict" or status == 409:
                    if attempt < _CONFLICT_RETRIES:
                        time.sleep(random.uniform(0, 0.05 * 2**attempt))
                        continue
                    raise StorageError(
                        f"S3 PutObject (If-None-Match) of {self._uri(full)} kept conflicting with concurrent "
                        f"writes ({_CONFLICT_RETRIES + 1} attempts); the object was not created by this call"
                    ) from exc
                raise self._error(exc, "PutObject (If-None-Match)", full) from exc
            except BotoCoreError as exc:
                error = self._error(exc, "PutObject (If-None-Match)", full)
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
        return self._get_full(self._full(key), max_bytes)

    def _get_full(self, full: str, max_bytes: int | None = None) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(_BODY_RETRIES + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, "GetObject", full) from exc
            self._bucket_verified = True
            where = f"s3://{self.bucket}/{full}"
            try:
                with response["Body"] as body:  # over the limit: closed unread
                    check_size(int(response.get("ContentLength") or 0), max_bytes, where)
                    data: bytes = body.read() if max_bytes is None else body.read(max_bytes + 1)
                check_size(len(data), max_bytes, where)
                return data
            except BotoCoreError as exc:  # the connection broke mid-body: botocore does not retry that
                if attempt == _BODY_RETRIES:
                    raise self._error(exc, "GetObject (reading the body)", full) from exc
                log.warning("GetObject of %s: body read failed (%s); retrying", full, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def stat(self, key: str) -> ObjectInfo:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._full(key)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=full)
        except (ClientError, BotoCoreError) as exc:
            raise self._missing(exc, "HeadObject", full) from exc
        self._bucket_verified = True
        return ObjectInfo(
            key=self._rel(full),
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
                raise self._error(exc, op, full_prefix or None) from exc
            self._bucket_verified = True
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
                    key=self._rel(full),
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

        full_keys = builtins.list(dict.fromkeys(self._full(k) for k in keys))
        failures: builtins.list[str] = []
        for start in range(0, len(full_keys), DELETE_BATCH):
            batch = full_keys[start:start + DELETE_BATCH]
            try:
                response = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, f"DeleteObjects ({len(batch)} keys)", batch[0]) from exc
            for err in response.get("Errors", ()):
                reason = f"{err.get('Code')} {err.get('Message', '')}".rstrip()
                failures.append(f"{self._uri(err.get('Key'))}: {reason}")
        if failures:
            shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
            raise StorageError(f"S3 DeleteObjects in {self.uri} failed for {len(failures)} key(s): {shown}")

    def copy(self, src: str, dst: str) -> None:
        """Server-side copy: one CopyObject, or a multipart UploadPartCopy (boto3's
        managed copy) when the source is larger than CopyObject allows (5 GiB)."""
        self._server_copy(self, src, dst)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        """A server-side copy when `source` is a bucket of the same S3 service reached
        with the same credentials (any bucket of it: CopyObject names the source's)."""
        store, source_key = source.locate(key)
        if not isinstance(store, S3Storage) or not self._same_service(store):
            return False
        self._server_copy(store, source_key, target_key)
        return True

    def _same_service(self, other: S3Storage) -> bool:
        if self._owns_client != other._owns_client or (not self._owns_client and self._client is not other._client):
            return False
        return (self.endpoint_url, self.region_name, self._credentials) == (
            other.endpoint_url, other.region_name, other._credentials)

    def _server_copy(self, store: S3Storage, src: str, dst: str) -> None:
        """Copy `src` of `store` (this store or another bucket of its service) to `dst`;
        errors name the source object."""
        from botocore.exceptions import BotoCoreError, ClientError

        full_src, full_dst = store._full(src), self._full(dst)
        source = {"Bucket": store.bucket, "Key": full_src}
        try:
            self.client.copy_object(Bucket=self.bucket, Key=full_dst, CopySource=source)
            return
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("InvalidRequest", "EntityTooLarge"):
                raise store._missing(exc, "CopyObject", full_src) from exc
            refused = exc
        except BotoCoreError as exc:
            raise store._error(exc, "CopyObject", full_src) from exc
        size = store.stat(src).size
        if size <= self._max_copy_object_size:  # refused for another reason than its size
            raise store._error(refused, "CopyObject", full_src) from refused
        log.debug("copying %s (%d bytes) to %s with multipart UploadPartCopy", full_src, size, full_dst)
        try:
            config = self._transfer_config(self._max_copy_object_size)
            self.client.copy(source, self.bucket, full_dst, Config=config)
        except Exception as exc:
            raise store._missing(self._unwrap(exc), "multipart copy", full_src) from exc

    # -- files ------------------------------------------------------------------------

    def _transfer_config(self, threshold: int | None = None) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=threshold if threshold is not None else 64 * 1024**2,
            multipart_chunksize=self._copy_chunksize if threshold is not None else 64 * 1024**2,
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
        """Streamed upload (multipart above 64 MiB); the object appears only when complete."""
        full = self._full(key)
        if not os.path.isfile(local_path):
            raise ObjectNotFound(f"{local_path} does not exist or is not a file")
        try:
            self.client.upload_file(local_path, self.bucket, full, Config=self._transfer_config())
        except Exception as exc:
            raise self._error(self._unwrap(exc), "upload", full) from exc

    def download_file(self, key: str, local_path: str) -> None:
        """Streamed download into a temp file renamed into place on success: one GET, its
        body written as it arrives (a read cut short is retried up to `max_attempts`);
        above the multipart threshold boto3's managed download, whose parallel ranged
        GETs pay off there but cost a HEAD and a thread pool per file below it."""
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._full(key)
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        tmp = f"{local_path}.sparkpoint-tmp-{uuid.uuid4().hex}"
        for attempt in range(1, self._max_attempts + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                raise self._missing(exc, "download", full) from exc
            except BotoCoreError as exc:
                raise self._error(exc, "download", full) from exc
            body = response["Body"]
            if int(response.get("ContentLength") or 0) > _SINGLE_GET_MAX:
                body.close()
                try:
                    self.client.download_file(self.bucket, full, local_path, Config=self._transfer_config())
                except Exception as exc:
                    raise self._missing(self._unwrap(exc), "download", full) from exc
                return
            try:
                with open(tmp, "wb") as handle:
                    handle.writelines(body.iter_chunks(_READ_CHUNK))
                os.replace(tmp, local_path)
                return
            except BotoCoreError as exc:  # the connection broke or stalled mid-body
                discard_file(tmp)
                if attempt == self._max_attempts:
                    raise self._error(exc, "download", full) from exc
                log.debug("download of %s cut short (attempt %d): %s; reading it again", full, attempt, exc)
            except BaseException:
                discard_file(tmp)
                raise

    def close(self) -> None:
        """Close the connection pool of the client this store created (it is rebuilt on
        next use); a client passed in by the caller is left alone."""
        with self._lock:
            client, self._client = self._client, (None if self._owns_client else self._client)
        if client is not None and self._owns_client:
            client.close()

