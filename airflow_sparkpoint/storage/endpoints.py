"""S3 endpoints and connection options: the storage options of an endpoint and a
region (`s3_options`, the one builder the CLI, the runtime's configuration and the
hook use), the one check of an endpoint that may reach a Spark conf
(`validate_endpoint_url`) and the one way to show one (`redact_url`, from
`storage.redact`, the scrubber of every message)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage.redact import redact_url  # re-exported: the one way to show an endpoint

__all__ = ["ENDPOINT_URL", "REGION_NAME", "S3_OPTIONS", "redact_url", "s3_options", "validate_endpoint_url"]

#: the storage options (`open_storage` keyword arguments for an ``s3://`` root, passed
#: on to sinks) that name the endpoint and the region
ENDPOINT_URL, REGION_NAME = "endpoint_url", "region_name"
#: every S3 connection option Sparkpoint passes around (credentials: never logged)
S3_OPTIONS = (ENDPOINT_URL, REGION_NAME, "aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def s3_options(endpoint: Any = None, region: Any = None) -> dict[str, Any]:
    """The storage options of an S3 `endpoint` and `region` (for `open_storage` and
    sinks): only those given, stripped; none means boto3's defaults."""
    options: dict[str, Any] = {}
    for name, value in ((ENDPOINT_URL, endpoint), (REGION_NAME, region)):
        text = "" if value is None else str(value).strip()
        if text:
            options[name] = text
    return options


def validate_endpoint_url(url: str, where: str) -> str:
    """`url` (stripped) as an S3 endpoint: ``http(s)://host[:port][/path]`` without
    credentials. The one check of every endpoint that can reach a Spark conf (a
    connection's, an ``aws`` connection's, ``spark.sparkpoint.s3.endpoint``): the conf is
    shown by the Spark UI, and S3 requests are signed with the access key, never with a
    URL's ``user:password@``. `where` names the setting in the error.

    :raises ConfigError: not such a URL, or it carries credentials (the error shows it
        without them).
    """
    value = url.strip()
    shown = redact_url(value)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ConfigError(f"{where}={shown!r} is not a URL; expected e.g. http://minio:9000") from None
    if "@" in parts.netloc:
        raise ConfigError(
            f"{where}={shown!r} carries credentials (user:password@ before the host; not "
            "shown); S3 requests are "
            "signed with an access key, so put it in the connection's login/password (or an aws connection) "
            "and give the endpoint as http(s)://host[:port]"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ConfigError(f"{where}={shown!r} is not a URL; expected e.g. http://minio:9000")
    return value
