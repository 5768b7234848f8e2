"""The records of the control channel (`airflow_sparkpoint.checkpoints.control`): a
`ControlRequest`, its `ControlResult`, the claim in ``<id>.ack.json``, request ids and
the keys of the three files.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.bounded import clip
from airflow_sparkpoint.exceptions import ConfigError, ControlError

__all__ = ["KINDS", "REQUEST_ID_RE", "SCHEMA_VERSION", "STATES", "TEXT_MAX_CHARS", "ControlRequest",
           "ControlResult", "new_request_id", "request_created_at"]

SCHEMA_VERSION = 1
KINDS = ("savepoint", "stop", "cancel")
STATES = ("pending", "acknowledged", "completed", "failed", "expired")
REQUEST_ID_RE = re.compile(r"^(\d{13})-([0-9a-f]{8})$")
_FILE_RE = re.compile(r"^(\d{13}-[0-9a-f]{8})\.(request|ack|result)\.json$")
#: the longest error or reason a control record carries (clipped: the records are bounded)
TEXT_MAX_CHARS = 16 * 1024


def new_request_id(now: float | None = None) -> str:
    """A time-sortable request id: ``<epoch ms, 13 digits>-<8 hex>``."""
    now = time.time() if now is None else now
    return f"{int(now * 1000):013d}-{uuid.uuid4().hex[:8]}"


def request_created_at(request_id: str) -> float:
    """When request `request_id` (a `new_request_id`) was made, in epoch seconds."""
    return int(request_id.split("-", 1)[0]) / 1000.0


def _check_request_id(request_id: str) -> str:
    if not isinstance(request_id, str) or not REQUEST_ID_RE.match(request_id):
        raise ConfigError(
            f"control request id {request_id!r} is invalid; expected '<13 digits>-<8 hex>' "
            "as printed by `sparkpoint savepoint --no-wait`"
        )
    return request_id


def _check_schema(data: Mapping[str, Any], what: str) -> None:
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ControlError(f"{what} has schema_version {version!r}; this release reads <= {SCHEMA_VERSION}")


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class ControlRequest:
    """A request to a running job. Immutable; after `deadline` it is expired."""

    id: str
    kind: str  # "savepoint" | "stop" | "cancel"
    job: str
    created_at: float  # epoch seconds
    deadline: float  # epoch seconds
    generation: int | None = None  # the target generation; None = whichever is current
    requested_by: str = ""

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "requested_by": clip(self.requested_by, 1024)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ControlRequest:
        """:raises ControlError: unknown schema version or malformed fields."""
        _check_schema(data, "control request")
        try:
            return cls(
                id=str(data["id"]),
                kind=str(data["kind"]),
                job=str(data["job"]),
                created_at=float(data["created_at"]),
                deadline=float(data["deadline"]),
                generation=_opt_int(data.get("generation")),
                requested_by=str(data.get("requested_by", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(f"control request is malformed ({exc.__class__.__name__}: {exc})") from None


@dataclass(frozen=True)
class ControlResult:
    """Where a request stands. `savepoint` is the savepoint URI once completed."""

    request_id: str
    state: str  # "pending" | "acknowledged" | "completed" | "failed" | "expired"
    generation: int | None = None
    savepoint: str | None = None
    batch_id: int | None = None
    error: str | None = None
    updated_at: float = 0.0

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "expired")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "error": None if self.error is None else clip(self.error, TEXT_MAX_CHARS)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ControlResult:
        """:raises ControlError: unknown schema version or malformed fields."""
        _check_schema(data, "control result")
        try:
            state = str(data["state"])
            if state not in STATES:
                raise ValueError(f"state {state!r}")
            return cls(
                request_id=str(data["request_id"]),
                state=state,
                generation=_opt_int(data.get("generation")),
                savepoint=None if data.get("savepoint") is None else str(data["savepoint"]),
                batch_id=_opt_int(data.get("batch_id")),
                error=None if data.get("error") is None else str(data["error"]),
                updated_at=float(data.get("updated_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(f"control result is malformed ({exc.__class__.__name__}: {exc})") from None


@dataclass(frozen=True)
class _Claim:
    """The content of ``<id>.ack.json``: who owns the outcome of a request."""

    state: str  # "acknowledged" (a job took it) | "expired" | "failed"
    generation: int | None
    at: float
    reason: str = ""

    def to_bytes(self, request_id: str) -> bytes:
        body = {"schema_version": SCHEMA_VERSION, "request_id": request_id, **asdict(self),
                "reason": clip(self.reason, TEXT_MAX_CHARS)}
        return json.dumps(body, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> _Claim:
        """:raises ControlError: unknown schema version or malformed fields."""
        try:
            _check_schema(raw, "control acknowledgement")
            return cls(str(raw["state"]), _opt_int(raw.get("generation")), float(raw["at"]),
                       str(raw.get("reason", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlError(f"control acknowledgement is malformed ({exc.__class__.__name__}: "
                               f"{exc})") from None


def _request_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.request.json"


def _ack_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.ack.json"


def _result_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.result.json"

