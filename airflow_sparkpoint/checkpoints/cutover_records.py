"""The records of a zero-downtime cutover (issue 49), as frozen types with their JSON:
the plan, green's progress, the agreement, the decision between green's claim and a
call-off, green's claim, the end, and `CutoverState`, every record of one cutover as read
now with the rules that read them together (`ended`, `taken`, `step`). Written and read
by `checkpoints.cutover.CutoverStore` only; docs/PROTOCOL.md, "Zero-downtime cutover",
has the protocol.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.bounded import clip
from airflow_sparkpoint.checkpoints.control_records import REQUEST_ID_RE, new_request_id
from airflow_sparkpoint.exceptions import ConfigError

__all__ = ["DECISIONS", "MODES", "OUTCOMES", "SCHEMA_VERSION", "CutoverAgreement", "CutoverClaim",
           "CutoverDecision", "CutoverEnd", "CutoverPlan", "CutoverProgress", "CutoverState",
           "ProgressSighting", "check_cutover_id", "check_int", "check_plan_bounds", "new_cutover_id",
           "sighting_of"]

SCHEMA_VERSION = 1
#: what green does with its output during the warm-up: discard it, or compare it with blue's
MODES = ("discard", "compare")
#: how a cutover ended: green committed its first batch; called off; blue restored after it
OUTCOMES = ("committed", "aborted", "rolled_back")
#: who won the race between green's claim and a call-off
DECISIONS = ("claim", "abort")
_REASON_MAX_CHARS = 16 * 1024


def new_cutover_id(now: float | None = None) -> str:
    """A time-sortable cutover id, made like a control request id: ``<epoch ms>-<8 hex>``."""
    return new_request_id(now)


def check_cutover_id(cutover_id: str) -> str:
    if not isinstance(cutover_id, str) or not REQUEST_ID_RE.match(cutover_id):
        raise ConfigError(f"cutover id {cutover_id!r} is invalid; expected '<13 digits>-<8 hex>' "
                          "(see `sparkpoint status`)")
    return cutover_id


def _check_schema(data: Mapping[str, Any], what: str) -> None:
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{what} has schema_version {version!r}; this release reads <= {SCHEMA_VERSION}")


def check_int(value: Any, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"cutover {what}={value!r} is invalid; expected an integer >= {low}")
    return value


def check_plan_bounds(*, mode: Any, lag_batches: Any, reach_timeout_s: Any) -> None:
    """The bounds a cutover plan must satisfy: `mode` one of `MODES`, `lag_batches` an
    integer >= 0, `reach_timeout_s` a finite number of seconds > 0. The one rule for
    `CutoverPlan` and every caller that plans one (checked before anything is read).

    :raises ConfigError: naming the bad value and what is expected."""
    if mode not in MODES:
        raise ConfigError(f"cutover mode={mode!r} is invalid; expected one of {', '.join(MODES)}")
    check_int(lag_batches, "lag_batches")
    if not isinstance(reach_timeout_s, (int, float)) or isinstance(reach_timeout_s, bool) \
            or not math.isfinite(reach_timeout_s) or reach_timeout_s <= 0:
        raise ConfigError(f"cutover reach_timeout_s={reach_timeout_s!r} is invalid; expected a "
                          "number of seconds > 0")


@dataclass(frozen=True)
class CutoverPlan:
    """What the orchestrator plans: hand job `job`'s generation `blue_generation` over
    to a green that warms up from checkpoint `warmup_uri` (batch `warmup_batch`) under
    the shadow job `green_job` in `green_root`."""

    id: str
    job: str
    blue_generation: int
    warmup_uri: str
    warmup_batch: int
    green_job: str
    green_root: str
    mode: str = "discard"
    #: the agreement waits until green is at most this many batches behind blue
    lag_batches: int = 2
    #: how long green may take to reach N after the agreement before the cutover is called off
    reach_timeout_s: float = 600.0
    requested_by: str = ""
    created_at: float = 0.0

    def __post_init__(self) -> None:
        check_cutover_id(self.id)
        layout.validate_job_name(self.job)
        layout.validate_job_name(self.green_job)
        if self.green_job == self.job:
            raise ConfigError(f"cutover green_job={self.green_job!r} is blue's own job name; expected a "
                              "shadow identity of its own (e.g. '<job>-shadow-<id>')")
        check_int(self.blue_generation, "blue_generation", 1)
        check_int(self.warmup_batch, "warmup_batch")
        check_plan_bounds(mode=self.mode, lag_batches=self.lag_batches, reach_timeout_s=self.reach_timeout_s)
        for name in ("warmup_uri", "green_root"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"cutover {name}={getattr(self, name)!r} is invalid; expected a URI")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "requested_by": clip(self.requested_by, 1024)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverPlan:
        _check_schema(data, "cutover plan")
        return cls(str(data["id"]), str(data["job"]), int(data["blue_generation"]), str(data["warmup_uri"]),
                   int(data["warmup_batch"]), str(data["green_job"]), str(data["green_root"]),
                   str(data.get("mode", "discard")), int(data.get("lag_batches", 2)),
                   float(data.get("reach_timeout_s", 600.0)), str(data.get("requested_by", "")),
                   float(data.get("created_at", 0.0)))


@dataclass(frozen=True)
class CutoverProgress:
    """Green's warm-up, as green last wrote it (overwritten, never trusted for a decision
    that needs the sink: the agreement's lag only)."""

    id: str
    replayed_batch: int | None
    seconds_per_batch: float | None = None
    shadow_generation: int | None = None
    verified_batch: int | None = None
    difference: str | None = None
    #: when green wrote it (green's clock: shown, never compared with the orchestrator's)
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "difference": None if self.difference is None else clip(self.difference, _REASON_MAX_CHARS)}

    def digest(self) -> str:
        """What a `ProgressSighting` remembers of it: a digest of its content (its time included)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def fresh(self, seen: ProgressSighting | None, now: float, max_age: float) -> bool:
        """Whether the orchestrator saw it written at most `max_age` seconds before `now`
        (or twice its pace per batch, when longer: a replay in progress writes none), on
        its own clock: `seen` (this record as the drive last saw it) saw it replace an
        earlier record at most that long ago. Never by `updated_at`: green's clock may run
        ahead (a dead green's record would read new) or behind (a live one's, old). A live
        green writes it after every replay and, caught up with blue (idle or not), at every
        poll of blue; one not seen to change is a dead green's, whose retry warms up from
        the plan's checkpoint again."""
        if seen is None or not seen.changed or seen.digest != self.digest():
            return False
        return now - seen.since <= max(max_age, 2 * (self.seconds_per_batch or 0.0))

    def within(self, blue_last: int, lag_batches: int, *, seen: ProgressSighting | None, now: float,
               max_age: float) -> bool:
        """Whether green may be agreed with: `fresh` at `now` as `seen`, at most `lag_batches`
        behind blue's newest batch `blue_last`, and either past its first replay of one of
        blue's batches (its pace is known: `seconds_per_batch`) or at `blue_last` itself
        (blue idle: nothing to replay, and blue reaches N only with new input, which
        green replays too). Behind blue before its first replay, green reports the
        checkpoint it warms up from while its first query start, seconds long, is still
        ahead of it."""
        if not self.fresh(seen, now, max_age):
            return False
        if self.replayed_batch is None or self.replayed_batch < blue_last - lag_batches:
            return False
        return self.seconds_per_batch is not None or self.replayed_batch >= blue_last

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverProgress:
        _check_schema(data, "cutover progress")

        def opt(name: str, kind: type) -> Any:
            value = data.get(name)
            return None if value is None else kind(value)

        return cls(str(data["id"]), opt("replayed_batch", int), opt("seconds_per_batch", float),
                   opt("shadow_generation", int), opt("verified_batch", int), opt("difference", str),
                   float(data.get("updated_at", 0.0)))


@dataclass(frozen=True)
class ProgressSighting:
    """Green's progress record as one drive last saw it, on the orchestrator's clock: its
    `digest` (`CutoverProgress.digest`), `since` when the drive first saw that record, and
    whether it `changed`: seen replacing an earlier record (a first sighting says nothing
    of its age). Carried in the drive's position between looks."""

    digest: str
    since: float
    changed: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProgressSighting:
        return cls(str(data["digest"]), float(data["since"]), bool(data.get("changed", False)))


def sighting_of(progress: CutoverProgress | None, before: ProgressSighting | None,
                now: float) -> ProgressSighting | None:
    """The sighting of `progress` read at `now` after sighting `before` (None: none yet):
    the same while the record is unchanged, else a new one since `now`, changed if a
    record was seen before it."""
    if progress is None:
        return before
    digest = progress.digest()
    if before is not None and before.digest == digest:
        return before
    return ProgressSighting(digest, now, before is not None)


@dataclass(frozen=True)
class CutoverAgreement:
    """Blue stops after batch `after_batch` (its ``stop_after`` request `request_id`)."""

    id: str
    after_batch: int
    request_id: str
    at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverAgreement:
        _check_schema(data, "cutover agreement")
        return cls(str(data["id"]), int(data["after_batch"]), str(data["request_id"]),
                   float(data.get("at", 0.0)))


@dataclass(frozen=True)
class CutoverClaim:
    """Green took generation `generation` (blue's + 1) and adopted the job at batch
    `batch_id`, from blue's final checkpoint `checkpoint` (the base of its lineage);
    `savepoint` is blue's final savepoint of that batch (what a rollback after the
    cutover restores; None from a blue that took none)."""

    id: str
    generation: int
    batch_id: int
    checkpoint: str
    at: float = 0.0
    savepoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverClaim:
        _check_schema(data, "cutover claim")
        savepoint = data.get("savepoint")
        return cls(str(data["id"]), int(data["generation"]), int(data["batch_id"]), str(data["checkpoint"]),
                   float(data.get("at", 0.0)), None if savepoint is None else str(savepoint))


@dataclass(frozen=True)
class CutoverEnd:
    """How a cutover ended: `outcome` one of `OUTCOMES`; `step` the step it ended at
    (``warmup``, ``agreement``, ``stop``, ``claim``, ``first_commit``, ``rollback``);
    `restore`, of a rollback, where it returned the job's lineage (blue's final savepoint,
    or a checkpoint of green's)."""

    id: str
    outcome: str
    step: str
    reason: str = ""
    generation: int | None = None
    by: str = ""
    at: float = 0.0
    restore: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ConfigError(f"cutover outcome {self.outcome!r} is invalid; expected one of "
                              f"{', '.join(OUTCOMES)}")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "reason": clip(self.reason, _REASON_MAX_CHARS),
                "by": clip(self.by, 1024)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverEnd:
        _check_schema(data, "cutover end")
        generation, restore = data.get("generation"), data.get("restore")
        return cls(str(data["id"]), str(data["outcome"]), str(data["step"]), str(data.get("reason", "")),
                   None if generation is None else int(generation), str(data.get("by", "")),
                   float(data.get("at", 0.0)), None if restore is None else str(restore))


@dataclass(frozen=True)
class CutoverDecision:
    """Whether green's claim or a call-off won cutover `id`: `outcome` ``claim`` (green's
    `claim`, as its ``claimed`` record will say) or ``abort`` (called off at `step`, with
    `reason`, `by`). Written once; the first writer decides."""

    id: str
    outcome: str
    claim: CutoverClaim | None = None
    step: str = ""
    reason: str = ""
    by: str = ""
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.outcome not in DECISIONS or (self.outcome == "claim") != (self.claim is not None):
            raise ConfigError(f"cutover decision {self.outcome!r} is invalid; expected 'claim' with green's "
                              "claim or 'abort' without one")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "id": self.id, "outcome": self.outcome,
                "claim": None if self.claim is None else self.claim.to_json(), "step": self.step,
                "reason": clip(self.reason, _REASON_MAX_CHARS), "by": clip(self.by, 1024), "at": self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CutoverDecision:
        _check_schema(data, "cutover decision")
        claim = data.get("claim")
        return cls(str(data["id"]), str(data["outcome"]),
                   None if claim is None else CutoverClaim.from_json(claim), str(data.get("step", "")),
                   str(data.get("reason", "")), str(data.get("by", "")), float(data.get("at", 0.0)))


@dataclass(frozen=True)
class CutoverState:
    """Every record of one cutover as read now (None: not written)."""

    plan: CutoverPlan
    progress: CutoverProgress | None = None
    agreed: CutoverAgreement | None = None
    claimed: CutoverClaim | None = None
    done: CutoverEnd | None = None
    errors: tuple[str, ...] = field(default=())
    #: green's generation rolled back after the cutover ended (outcome ``rolled_back``)
    rolled_back: CutoverEnd | None = None
    #: green's claim or the call-off, whichever came first (None: neither yet, or a cutover
    #: of a release before the decision record)
    decision: CutoverDecision | None = None

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def ended(self) -> CutoverEnd | None:
        """How it ended: the done record, else an ``abort`` decision (a call-off that has
        not written its end yet: it ended there)."""
        if self.done is not None or self.decision is None or self.decision.outcome != "abort":
            return self.done
        d = self.decision
        return CutoverEnd(self.id, "aborted", d.step or "stop", d.reason, None, d.by, d.at)

    @property
    def taken(self) -> CutoverClaim | None:
        """Green's claim of the job: its ``claimed`` record (written after its origin), else
        a ``claim`` decision (green won, and may have died before its origin and record:
        the job is green's all the same)."""
        if self.claimed is not None or self.decision is None:
            return self.claimed
        return self.decision.claim

    @property
    def open(self) -> bool:
        return self.ended is None

    @property
    def step(self) -> str:
        """Where it stands: planned, agreed, claimed, its outcome, or ``rolled_back``
        once green's generation was rolled back after it committed."""
        ended = self.ended
        if self.rolled_back is not None:
            return "rolled_back"
        if ended is not None:
            return ended.outcome
        return "claimed" if self.taken else ("agreed" if self.agreed else "planned")

    def to_json(self) -> dict[str, Any]:
        """The cutover as `sparkpoint cutover list --json` and the checkpoints page show
        it (docs/CLI.md): its step, blue's generation, N, green's generation and progress,
        how it ended, whether green was rolled back after it, and who won the decision
        between green's claim and a call-off (``decision``: claim, abort or None)."""
        progress, done, claimed = self.progress, self.ended, self.taken
        return {"id": self.id, "step": self.step, "blue_generation": self.plan.blue_generation,
                "after_batch": self.agreed.after_batch if self.agreed else None,
                "green_generation": claimed.generation if claimed else None,
                "outcome": done.outcome if done else None, "reason": done.reason if done else None,
                "created_at": self.plan.created_at,
                "rolled_back_at": self.rolled_back.at if self.rolled_back else None,
                "mode": self.plan.mode, "warmup_batch": self.plan.warmup_batch,
                "green_replayed_batch": progress.replayed_batch if progress else None,
                "ended_at": done.at if done else None, "ended_step": done.step if done else None,
                "blue_checkpoint": claimed.checkpoint if claimed else None,
                "blue_savepoint": claimed.savepoint if claimed else None,
                "rolled_back_to": self.rolled_back.restore if self.rolled_back else None,
                "decision": self.decision.outcome if self.decision else None}
