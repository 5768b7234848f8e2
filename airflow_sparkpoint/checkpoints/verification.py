"""Restore-drill outcomes, stored next to the snapshot they verified.

``<snapshot dir>/_verification.json`` holds the outcome of the last drill of that
checkpoint or savepoint (``sparkpoint verify``: the files and every state store read
back; `SparkpointDrillOperator`: the whole application restored under a scratch
identity). It is not part of the snapshot: ``_metadata`` does not list it, restoring
ignores it, and disposing of the snapshot deletes it with the directory.

Pure Python over a `Storage`: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_sparkpoint.checkpoints import bounded
from airflow_sparkpoint.checkpoints.layout import VERIFICATION, limits_of
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import Storage

__all__ = ["ERROR_MAX_CHARS", "LEVELS", "SCHEMA_VERSION", "VerificationRecord", "read_verification",
           "read_verifications", "verification_key", "write_verification"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
LEVELS = ("files", "state", "drill")
#: the longest error a drill record carries (a longer one is clipped: the record is bounded)
ERROR_MAX_CHARS = 16 * 1024


@dataclass(frozen=True)
class VerificationRecord:
    """The outcome of one restore drill.

    `level`: ``files`` (sizes and checksums), ``state`` (also every state store of every
    operator and partition read back: `sparkpoint verify`) or ``drill`` (the application
    itself restored and run to the end: `SparkpointDrillOperator`). `error` is None iff
    the drill passed.
    """

    verified_at: float
    level: str
    duration_s: float
    checks: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    verified_by: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"verification level {self.level!r} is not allowed; expected "
                              f"one of {', '.join(LEVELS)}")

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "verified_at": self.verified_at,
            "level": self.level,
            "duration_s": self.duration_s,
            "checks": dict(self.checks),
            "error": self.error,
            "verified_by": self.verified_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerificationRecord:
        """:raises ValueError: malformed or of a newer schema version."""
        version = data.get("schema_version", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"verification record has schema_version {version!r}; this release "
                             f"reads <= {SCHEMA_VERSION}")
        try:
            return cls(
                verified_at=float(data["verified_at"]),
                level=str(data["level"]),
                duration_s=float(data.get("duration_s", 0.0)),
                checks=dict(data.get("checks") or {}),
                error=None if data.get("error") is None else str(data["error"]),
                verified_by=str(data.get("verified_by", "")),
                schema_version=version,
            )
        except (KeyError, TypeError, ConfigError) as exc:
            raise ValueError(f"verification record is malformed ({exc.__class__.__name__}: {exc})") from None


def verification_key(snapshot_key: str) -> str:
    """Where the record of the snapshot directory `snapshot_key` (``chk-7``,
    ``savepoints/savepoint-7-ab12cd34``, relative to the job root) lives."""
    return f"{snapshot_key.rstrip('/')}/{VERIFICATION}"


def write_verification(store: Storage, snapshot_key: str, record: VerificationRecord) -> None:
    """Record `record` for the snapshot at `snapshot_key` (replacing an earlier one), its
    error clipped to `ERROR_MAX_CHARS`.

    :raises CatalogError: it would still be over its limits (`layout.limits_of`).
    """
    if record.error is not None:
        record = replace(record, error=bounded.clip(record.error, ERROR_MAX_CHARS))
    key = verification_key(snapshot_key)
    body = json.dumps(record.to_json(), sort_keys=True).encode()
    bounded.check_writable(body, limits_of(key), f"{store.uri}/{key}")
    store.put(key, body)


def read_verification(store: Storage, snapshot_key: str) -> VerificationRecord | None:
    """The last drill of the snapshot at `snapshot_key`, or None if it was never verified
    (or the record is unreadable: logged, never raised, a listing must not fail on it)."""
    key = verification_key(snapshot_key)
    return bounded.read_record_or_warn(store, key, bounded.json_object(VerificationRecord.from_json),
                                       limits=limits_of(key), where=f"{store.uri}/{key}",
                                       what="verification record", unreachable=True)


def read_verifications(store: Storage, snapshot_keys: Sequence[str]) -> dict[str, VerificationRecord]:
    """Records of the given snapshot directories that have one (one GET each)."""
    found = {}
    for key in snapshot_keys:
        record = read_verification(store, key)
        if record is not None:
            found[key] = record
    return found
