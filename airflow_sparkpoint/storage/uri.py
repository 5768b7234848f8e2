"""Storage URIs: their parts (`split_uri`), below every store (a store reaches another
location of its service by URI: `Storage.at`)."""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from airflow_sparkpoint.exceptions import InvalidPath

__all__ = ["S3_SCHEMES", "split_uri"]

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
