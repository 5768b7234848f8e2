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

from airflow_sparkpoint.storage.base import ObjectInfo, PrefixedStorage, Storage, join_key, normalize_key
from airflow_sparkpoint.storage.local import LocalStorage
from airflow_sparkpoint.storage.memory import MemoryStorage
from airflow_sparkpoint.storage.uri import S3_SCHEMES as S3_SCHEMES  # kept a name of this package
from airflow_sparkpoint.storage.uri import split_uri

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
