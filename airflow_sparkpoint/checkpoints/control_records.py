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

__all__ = ["FILE_RE", "KINDS", "REQUEST_ID_RE", "SCHEMA_VERSION", "STATES", "TEXT_MAX_CHARS", "ControlClaim",
           "ControlRequest", "ControlResult", "ack_key", "check_kind", "check_request_id", "new_request_id",
           "request_created_at", "request_key", "result_key"]

#: the newest schema this release reads. A record is written with the oldest schema that
#: holds it: a ``stop_after`` request (and a result naming a checkpoint) with 2, so that a
#: driver of a release before it refuses the request as unreadable (and never serves it as
#: a plain stop) while every other record stays readable by it.
SCHEMA_VERSION = 2
#: the kinds of request; extended, never renamed (a public contract)
KINDS = ("savepoint", "stop", "cancel", "stop_after")
#: the schema version a request of each kind is written with (`SCHEMA_VERSION`)
_KIND_SCHEMA = {"stop_after": 2}
STATES = ("pending", "acknowledged", "completed", "failed", "expired")
REQUEST_ID_RE = re.compile(r"^(\d{13})-([0-9a-f]{8})$")
FILE_RE = re.compile(r"^(\d{13}-[0-9a-f]{8})\.(request|ack|result)\.json$")
#: the longest error or reason a control record carries (clipped: the records are bounded)
TEXT_MAX_CHARS = 16 * 1024


def new_request_id(now: float | None = None) -> str:
    """A time-sortable request id: ``<epoch ms, 13 digits>-<8 hex>``."""
    now = time.time() if now is None else now
    return f"{int(now * 1000):013d}-{uuid.uuid4().hex[:8]}"


def request_created_at(request_id: str) -> float:
    """When request `request_id` (a `new_request_id`) was made, in epoch seconds."""
    return int(request_id.split("-", 1)[0]) / 1000.0


def check_request_id(request_id: str) -> str:
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


def check_kind(kind: str, after_batch: int | None) -> None:
    """The one rule of a request's kind and its ``after_batch``.

    :raises ControlError: `kind` is not one of `KINDS` (a newer release's request), or
        ``after_batch`` is missing or negative for ``stop_after``, or given for another kind.
    """
    if kind not in KINDS:
        raise ControlError(f"control request kind {kind!r} is unknown to this release; it serves "
                           f"{', '.join(KINDS)} (is the request from a newer release?)")
    if kind == "stop_after":
        if isinstance(after_batch, bool) or not isinstance(after_batch, int) or after_batch < 0:
            raise ControlError("a stop_after request needs after_batch=<a batch id >= 0>; "
                               f"got {after_batch!r}")
    elif after_batch is not None:
        raise ControlError(f"after_batch={after_batch!r} belongs to stop_after requests, not to {kind}")


@dataclass(frozen=True)
class ControlRequest:
    """A request to a running job. Immutable; after `deadline` it is expired."""

    id: str
    kind: str  # "savepoint" | "stop" | "cancel" | "stop_after"
    job: str
    created_at: float  # epoch seconds
    deadline: float  # epoch seconds
    generation: int | None = None  # the target generation; None = whichever is current
    requested_by: str = ""
    #: ``stop_after``: the last batch the run stages and commits before it stops
    after_batch: int | None = None
    #: ``stop_after``: the zero-downtime cutover it was filed for (its call-off withdraws
    #: it, even before the agreement names it), or None
    cutover: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline

    def to_json(self) -> dict[str, Any]:
        body = {"schema_version": _KIND_SCHEMA.get(self.kind, 1), **asdict(self),
                "requested_by": clip(self.requested_by, 1024)}
        if self.after_batch is None:
            del body["after_batch"]  # a record of the first schema, as earlier releases wrote it
        if self.cutover is None:
            del body["cutover"]
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ControlRequest:
        """:raises ControlError: unknown schema version or kind, or malformed fields."""
        _check_schema(data, "control request")
        try:
            request = cls(
                id=str(data["id"]),
                kind=str(data["kind"]),
                job=str(data["job"]),
                created_at=float(data["created_at"]),
                deadline=float(data["deadline"]),
                generation=_opt_int(data.get("generation")),
                requested_by=str(data.get("requested_by", "")),
                after_batch=_opt_int(data.get("after_batch")),
                cutover=None if data.get("cutover") is None else str(data["cutover"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(f"control request is malformed ({exc.__class__.__name__}: {exc})") from None
        check_kind(request.kind, request.after_batch)
        return request


@dataclass(frozen=True)
class ControlResult:
    """Where a request stands. `savepoint` is the savepoint URI once completed (for a
    completed ``stop_after``: the run's final savepoint, of the same batch);
    `checkpoint` the URI of the run's final checkpoint (a completed ``stop_after``)."""

    request_id: str
    state: str  # "pending" | "acknowledged" | "completed" | "failed" | "expired"
    generation: int | None = None
    savepoint: str | None = None
    batch_id: int | None = None
    error: str | None = None
    updated_at: float = 0.0
    checkpoint: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "expired")

    def to_json(self) -> dict[str, Any]:
        body = {"schema_version": 1 if self.checkpoint is None else 2, **asdict(self),
                "error": None if self.error is None else clip(self.error, TEXT_MAX_CHARS)}
        if self.checkpoint is None:
            del body["checkpoint"]
        return body

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
                checkpoint=None if data.get("checkpoint") is None else str(data["checkpoint"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(f"control result is malformed ({exc.__class__.__name__}: {exc})") from None


@dataclass(frozen=True)
class ControlClaim:
    """The content of ``<id>.ack.json``: who owns the outcome of a request."""

    state: str  # "acknowledged" (a job took it) | "expired" | "failed"
    generation: int | None
    at: float
    reason: str = ""

    def to_bytes(self, request_id: str) -> bytes:
        body = {"schema_version": 1, "request_id": request_id, **asdict(self),
                "reason": clip(self.reason, TEXT_MAX_CHARS)}
        return json.dumps(body, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ControlClaim:
        """:raises ControlError: unknown schema version or malformed fields."""
        try:
            _check_schema(raw, "control acknowledgement")
            return cls(str(raw["state"]), _opt_int(raw.get("generation")), float(raw["at"]),
                       str(raw.get("reason", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlError(f"control acknowledgement is malformed ({exc.__class__.__name__}: "
                               f"{exc})") from None


def request_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.request.json"


def ack_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.ack.json"


def result_key(request_id: str) -> str:
    return f"{layout.CONTROL}/{request_id}.result.json"

