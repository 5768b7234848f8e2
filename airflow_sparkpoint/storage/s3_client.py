"""An S3 bucket and prefix as `S3Storage` reaches it (`S3Connection`, which the store
holds): bucket name rules, the boto3 client (built on first use, credentials and
secrets kept out of messages), keys under the prefix, the bucket check, and the
translation of botocore errors into the project's error tree::

    NoSuchKey / 404 on an object            ObjectNotFound
    412 PreconditionFailed (put_if_absent)  ObjectExists
    NoSuchBucket / 404 / 403 on the bucket  StorageError  "bucket 'x' does not exist or ..."
    connection refused, DNS, timeouts       StorageError  "S3 endpoint ... is unreachable"
    anything else                           StorageError  naming the operation and s3:// URI
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, ObjectNotFound, StorageError
from airflow_sparkpoint.storage.base import normalize_key, normalize_prefix
from airflow_sparkpoint.storage.redact import redact_url as _redact_url
from airflow_sparkpoint.storage.redact import register, scrub, userinfo

__all__ = ["MAX_COPY_OBJECT_SIZE", "S3Connection", "parse_timestamp", "validate_bucket_name"]

#: the largest object a single CopyObject may copy; bigger ones go through UploadPartCopy
MAX_COPY_OBJECT_SIZE = 5 * 1024**3
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_BUCKET_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_BUCKET_MISSING_CODES = frozenset({"NoSuchBucket"})
_ACCESS_CODES = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled"})


#: botocore's loader of its service models, shared by every store's session (`_new_session`)
_LOADER: Any = None
_LOADER_LOCK = threading.Lock()


def _new_session(credentials: tuple[str | None, str | None, str | None], region_name: str | None) -> Any:
    """A boto3 session of its own for one store (credentials resolved as botocore does, from
    the arguments, the environment or its files, at the first client) that reads botocore's
    service models through a loader shared by the process: a loader of its own reads them
    again, ≈ 0.1 s for every store's first client, several per job start and restore."""
    global _LOADER
    import boto3.session
    import botocore.loaders
    import botocore.session

    core = botocore.session.Session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
    key_id, secret, token = credentials
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = botocore.loaders.create_loader()
        core.register_component("data_loader", _LOADER)
        session = boto3.session.Session(botocore_session=core, aws_access_key_id=key_id,
                                        aws_secret_access_key=secret, aws_session_token=token,
                                        region_name=region_name)
        # boto3 adds its own data path to the loader at every session: once is enough
        _LOADER.search_paths[:] = list(dict.fromkeys(_LOADER.search_paths))
    return session


def _forget_loader() -> None:
    global _LOADER, _LOADER_LOCK
    _LOADER, _LOADER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loader)  # a lock held by another thread at fork stays held


def parse_timestamp(value: Any) -> Any:
    """botocore's timestamp parser for this store's client: the ISO 8601 form S3 uses in
    listings (``2026-11-27T08:53:39.000Z``) by `datetime.fromisoformat`, anything else
    (the HTTP date of a HEAD) by botocore's own parser. botocore's takes ≈ 100 µs per
    timestamp, which was most of the CPU of listing ``shared/`` at every checkpoint
    (1,000 objects: 0.11 s, 0.045 s with this); the result is the same aware datetime."""
    if isinstance(value, str) and "T" in value:
        try:
            parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)
    from botocore.utils import parse_timestamp as botocore_parse  # imported on this rare path only

    return botocore_parse(value)


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


class S3Connection:
    """What every `S3Storage` operation stands on, held by the store: its settings, the
    boto3 client, keys under the prefix, the bucket check and error translation (see
    `S3Storage` for the parameters).

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
        register(aws_secret_access_key, aws_session_token, *userinfo(endpoint_url))  # out of every message
        self.max_attempts = max_attempts
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_pool_connections = max_pool_connections
        # Custom endpoints (MinIO, moto, on-prem) rarely resolve bucket.host names.
        self._addressing_style = addressing_style or ("path" if endpoint_url else "auto")
        self._extra_config = config
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()
        #: the bucket answered once (an object request, a listing or `check` succeeded):
        #: a bare 404 then blames the key (`missing`)
        self.bucket_verified = False

    # -- plumbing ---------------------------------------------------------------------

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={_redact_url(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"S3Connection({self.uri!r}{endpoint})"

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
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        config = Config(
            # botocore's "max_attempts" counts retries; "total_max_attempts" counts the first
            # try too, which is what our `max_attempts` means (1 = never retry).
            retries={"total_max_attempts": self.max_attempts, "mode": "adaptive"},
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            max_pool_connections=self._max_pool_connections,
            s3={"addressing_style": self._addressing_style},
        )
        if self._extra_config is not None:
            config = config.merge(self._extra_config)
        try:
            # botocore never uses a URL's user:password (S3 requests are signed) but quotes the
            # URL in its errors, which then reach tracebacks: the client never sees it.
            endpoint = _redact_url(self.endpoint_url) if self.endpoint_url else None
            session = _new_session(self._credentials, self.region_name)
            session.get_credentials()  # resolved (maybe over the network) before the lock; cached
            with _LOADER_LOCK:  # the shared loader's caches are filled by one client at a time
                return session.client("s3", endpoint_url=endpoint, config=config)
        except (BotoCoreError, ValueError) as exc:
            message = f"cannot create an S3 client for {self.uri} at {self.endpoint}: {exc}"
            raise StorageError(self.scrub(message)) from None

    def close(self) -> None:
        """Close the connection pool of the client this connection created (it is rebuilt
        on next use); a client passed in by the caller is left alone."""
        with self._lock:
            client, self._client = self._client, (None if self._owns_client else self._client)
        if client is not None and self._owns_client:
            client.close()

    def sibling(self, bucket: str, prefix: str = "") -> S3Connection:
        """A connection to `bucket`/`prefix` of this connection's service, with its
        settings and credentials (and a caller's client, shared): `same_service` holds.

        :raises InvalidPath: the bucket name is invalid.
        """
        other = object.__new__(S3Connection)  # not copy.copy: pickling's state drops a caller's client
        other.__dict__.update(self.__dict__)
        other.bucket = validate_bucket_name(bucket)
        other.prefix = normalize_prefix(prefix)
        other.uri = f"s3://{other.bucket}/{other.prefix.rstrip('/')}" if other.prefix else f"s3://{other.bucket}"
        other._client = None if self._owns_client else self._client  # an owned client is closed by its owner
        other._lock = threading.Lock()
        other.bucket_verified = False
        return other

    def same_service(self, other: S3Connection) -> bool:
        """Whether `other` reaches the same S3 service with the same credentials and
        client ownership (a server-side copy between their buckets works)."""
        if (self._owns_client != other._owns_client
                or (not self._owns_client and self._client is not other._client)):
            return False
        return (self.endpoint_url, self.region_name, self._credentials) == (
            other.endpoint_url, other.region_name, other._credentials)

    @property
    def endpoint(self) -> str:
        """The endpoint for messages (``user:password`` redacted)."""
        client = self._client
        if client is not None:
            try:
                return _redact_url(str(client.meta.endpoint_url))
            except AttributeError:  # pragma: no cover - a foreign client object
                pass
        if self.endpoint_url:
            return _redact_url(self.endpoint_url)
        return "the default AWS S3 endpoint"

    def full_key(self, key: str) -> str:
        """The bucket key of the store's `key` (under the prefix).

        :raises InvalidPath: `key` is not a valid key.
        """
        return self.prefix + normalize_key(key)

    def relative_key(self, full_key: str) -> str:
        """The store's key of the bucket key `full_key`."""
        return full_key[len(self.prefix):]

    def uri_of(self, full_key: str | None) -> str:
        """``s3://bucket/<full_key>``; the store's URI without a key."""
        return f"s3://{self.bucket}/{full_key}" if full_key else self.uri

    def scrub(self, message: str) -> str:
        """`message` without secrets (`storage.redact.scrub`): the secret key and session
        token (botocore never puts them in errors, but a server message might echo them),
        the endpoint URL's ``user:password`` (botocore's connection errors quote it) and any
        other secret this process registered."""
        return scrub(message, [*self._credentials[1:], *userinfo(self.endpoint_url)])

    def error(self, exc: BaseException, op: str, full_key: str | None = None) -> StorageError:
        """Translate a botocore/boto3 exception into the project's error tree."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )

        target = self.uri_of(full_key)
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
                    self.scrub(
                        f"S3 {op} of {target} at {self.endpoint} was denied ({code or status}); "
                        "check the credentials and the bucket policy"
                    )
                )
            return StorageError(
                self.scrub(
                    f"S3 {op} of {target} at {self.endpoint} failed: {code} (HTTP {status}): {message}"
                )
            )
        if isinstance(exc, (ConnectionError, HTTPClientError)):
            return StorageError(
                self.scrub(f"S3 {op} of {target} failed: endpoint {self.endpoint} is unreachable: {exc}")
            )
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"S3 {op} of {target} failed: no AWS credentials found; pass aws_access_key_id/"
                "aws_secret_access_key, or configure the environment, ~/.aws or an instance role"
            )
        if isinstance(exc, BotoCoreError):
            return StorageError(self.scrub(f"S3 {op} of {target} at {self.endpoint} failed: {exc}"))
        return StorageError(self.scrub(f"S3 {op} of {target} failed: {type(exc).__name__}: {exc}"))

    def _bucket_error(self, op: str, target: str, code: str) -> StorageError:
        return StorageError(
            f"bucket {self.bucket!r} does not exist or is not accessible at {self.endpoint} "
            f"({op} of {target}: {code}); create it or fix spark.sparkpoint.dir / the credentials"
        )

    def missing(self, exc: BaseException, op: str, full_key: str) -> StorageError:
        """Map a 404 from an object request; a bare 404 (HEAD has no body) could also mean
        a missing bucket, so the bucket is checked once per store before blaming the key.

        :raises StorageError: the bucket check failed (missing, not accessible, unreachable).
        """
        error = self.error(exc, op, full_key)
        if isinstance(error, ObjectNotFound) and not self.bucket_verified:
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
            raise self.error(exc, "HeadBucket") from exc
        except BotoCoreError as exc:
            raise self.error(exc, "HeadBucket") from exc
        self.bucket_verified = True
