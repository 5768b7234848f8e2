"""Rebuilding a sink from its transaction record: the built-in sinks are imported here,
so that they are registered (`Sink.registered`) before a kind is looked up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.delta import DeltaSink
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import S3Sink

__all__ = ["BUILT_IN", "sink_from_config"]

#: the sinks that ship with the package (each registers its kind when its class is made)
BUILT_IN: tuple[type[Sink], ...] = (DeltaSink, DirectorySink, S3Sink)


def sink_from_config(kind: str, config: Mapping[str, Any]) -> Sink:
    """Rebuild a sink from a transaction record (for `sparkpoint commit` and the operator).

    :raises ConfigError: unknown sink kind.
    """
    registered = Sink.registered()
    try:
        cls = registered[kind]
    except KeyError:
        known = ", ".join(sorted(registered)) or "none"
        raise ConfigError(f"sink kind {kind!r} is unknown; expected one of: {known}") from None
    return cls(**dict(config))
