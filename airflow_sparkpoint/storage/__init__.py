"""Where Sparkpoint's bytes live. `open_storage` picks an implementation by URI scheme.

=========================  ==========================================
URI                        implementation
=========================  ==========================================
``/abs/path``, ``rel``     `LocalStorage`
``file:///abs/path``       `LocalStorage`
``s3://bucket/prefix``     `S3Storage` (``s3a://`` and ``s3n://`` are aliases)
``memory://name``          `MemoryStorage` (shared per name within a process)
=========================  ==========================================
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlparse

from airflow_sparkpoint.exceptions import InvalidPath
from airflow_sparkpoint.storage.base import ObjectInfo, PrefixedStorage, Storage, join_key, normalize_key
from airflow_sparkpoint.storage.local import LocalStorage
from airflow_sparkpoint.storage.memory import MemoryStorage

__all__ = [
    "LocalStorage",
    "MemoryStorage",
    "ObjectInfo",
    "PrefixedStorage",
    "Storage",
    "join_key",
    "normalize_key",
    "open_storage",
    "split_uri",
]

S3_SCHEMES = ("s3", "s3a", "s3n")


def split_uri(uri: str) -> tuple[str, str, str]:
    """Split a storage URI into ``(scheme, bucket_or_host, path)``.

    Plain paths come back as ``("file", "", abspath)``.

    :raises InvalidPath: the URI is empty, has an unknown scheme, or lacks a bucket.
    """
    import os

    if not isinstance(uri, str) or not uri.strip():
        raise InvalidPath(f"storage URI {uri!r} is empty; expected a path, file:///path or s3://bucket/prefix")
    if "://" not in uri:
        return "file", "", os.path.abspath(uri)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidPath(f"storage URI {uri!r} names host {parsed.netloc!r}; expected file:///absolute/path")
        return "file", "", unquote(parsed.path) or "/"
    if scheme in S3_SCHEMES:
        if not parsed.netloc:
            raise InvalidPath(f"storage URI {uri!r} has no bucket; expected s3://bucket/prefix")
        return "s3", parsed.netloc, parsed.path.strip("/")
    if scheme == "memory":
        return "memory", parsed.netloc or "default", parsed.path.strip("/")
    raise InvalidPath(
        f"storage URI {uri!r} has unsupported scheme {scheme!r}; expected a path, file://, s3:// "
        "(or s3a://) or memory://"
    )


def open_storage(uri: str, **options: Any) -> Storage:
    """Open the store rooted at `uri`.

    `options` go to the implementation (for S3: ``endpoint_url``, ``region_name``,
    ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``).

    :raises InvalidPath: the URI is malformed or its scheme unsupported.
    :raises ImportError: the optional dependency for the scheme is missing (the message
        gives the ``pip install`` command).
    """
    scheme, bucket, path = split_uri(uri)
    if scheme == "file":
        return LocalStorage(path)
    if scheme == "memory":
        store: Storage = MemoryStorage(bucket)
        return store.child(path) if path else store
    try:
        from airflow_sparkpoint.storage.s3 import S3Storage
    except ImportError as exc:  # pragma: no cover - boto3 is a core dependency today
        raise ImportError(
            f"s3:// storage needs boto3 ({exc}); install it with: pip install 'airflow-sparkpoint[s3]'"
        ) from exc
    return S3Storage(bucket, path, **options)
