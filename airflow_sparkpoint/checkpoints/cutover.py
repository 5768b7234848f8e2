"""The records of a zero-downtime cutover (issue 49): blue, the running generation of a
job, hands the job to green at an agreed batch N. One module writes and reads them; the
keys are `layout.cutover_key`'s, under ``<job>/cutover/``::

    <cid>.plan.json     the orchestrator  put_if_absent: blue's generation, green's warm-up
                                          start, green's shadow identity, mode and bounds
    <cid>.green.json    green             overwritten: how far the warm-up replayed
    <cid>.agreed.json   the orchestrator  put_if_absent: N and blue's ``stop_after`` request
    <cid>.claimed.json  green             put_if_absent: green's generation (blue's + 1),
                                          written after the claim and the checks after it
    <cid>.done.json     green or the      put_if_absent: how it ended (committed, aborted,
                        orchestrator      rolled_back); the first writer decides. Green's
                                          run writes ``committed`` after its first commit
                                          into blue's sinks (`runtime.cutover`)
    <cid>.rollback.json the rollback      put_if_absent: green's generation was rolled back
                                          after the cutover committed (`services.rollback`);
                                          the done record stays as it was

Every record but the progress is written once (an atomic create) and never rewritten: a
step's precondition is read, and its record's create is the step. A cutover is *open*
from its plan until its done record; while one is open only its green may take the job's
next generation (`open_cutover`, used by `runtime.takeover.check_start`), so a retry of
blue's task cannot race green's claim. docs/PROTOCOL.md, "Zero-downtime cutover", has
the whole protocol.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.bounded import clip
from airflow_sparkpoint.checkpoints.control_records import REQUEST_ID_RE, new_request_id
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, CutoverError, ObjectExists

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["MODES", "OUTCOMES", "SCHEMA_VERSION", "CutoverAgreement", "CutoverClaim", "CutoverEnd",
           "CutoverPlan", "CutoverProgress", "CutoverState", "CutoverStore", "new_cutover_id"]

SCHEMA_VERSION = 1
#: what green does with its output during the warm-up: discard it, or compare it with blue's
MODES = ("discard", "compare")
#: how a cutover ended: green committed its first batch; called off; blue restored after it
OUTCOMES = ("committed", "aborted", "rolled_back")
_REASON_MAX_CHARS = 16 * 1024


def new_cutover_id(now: float | None = None) -> str:
    """A time-sortable cutover id, made like a control request id: ``<epoch ms>-<8 hex>``."""
    return new_request_id(now)


def _check_id(cutover_id: str) -> str:
    if not isinstance(cutover_id, str) or not REQUEST_ID_RE.match(cutover_id):
        raise ConfigError(f"cutover id {cutover_id!r} is invalid; expected '<13 digits>-<8 hex>' "
                          "(see `sparkpoint status`)")
    return cutover_id


def _check_schema(data: Mapping[str, Any], what: str) -> None:
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{what} has schema_version {version!r}; this release reads <= {SCHEMA_VERSION}")


def _int(value: Any, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"cutover {what}={value!r} is invalid; expected an integer >= {low}")
    return value


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
        _check_id(self.id)
        layout.validate_job_name(self.job)
        layout.validate_job_name(self.green_job)
        if self.green_job == self.job:
            raise ConfigError(f"cutover green_job={self.green_job!r} is blue's own job name; expected a "
                              "shadow identity of its own (e.g. '<job>-shadow-<id>')")
        _int(self.blue_generation, "blue_generation", 1)
        _int(self.warmup_batch, "warmup_batch")
        _int(self.lag_batches, "lag_batches")
        if self.mode not in MODES:
            raise ConfigError(f"cutover mode={self.mode!r} is invalid; expected one of {', '.join(MODES)}")
        if not isinstance(self.reach_timeout_s, (int, float)) or isinstance(self.reach_timeout_s, bool) \
                or not math.isfinite(self.reach_timeout_s) or self.reach_timeout_s <= 0:
            raise ConfigError(f"cutover reach_timeout_s={self.reach_timeout_s!r} is invalid; expected a "
                              "number of seconds > 0")
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
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self),
                "difference": None if self.difference is None else clip(self.difference, _REASON_MAX_CHARS)}

    def within(self, blue_last: int, lag_batches: int) -> bool:
        """Whether green may be agreed with: at most `lag_batches` behind blue's newest
        batch `blue_last`, and either past its first replay of one of blue's batches (its
        pace is known: `seconds_per_batch`) or at `blue_last` itself (blue idle: nothing
        to replay, and blue reaches N only with new input, which green replays too).
        Behind blue before its first replay, green reports the checkpoint it warms up
        from while its first query start, seconds long, is still ahead of it."""
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

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def open(self) -> bool:
        return self.done is None

    @property
    def step(self) -> str:
        """Where it stands: planned, agreed, claimed, its outcome, or ``rolled_back``
        once green's generation was rolled back after it committed."""
        if self.rolled_back is not None:
            return "rolled_back"
        if self.done is not None:
            return self.done.outcome
        return "claimed" if self.claimed else ("agreed" if self.agreed else "planned")

    def to_json(self) -> dict[str, Any]:
        """The cutover as `sparkpoint cutover list --json` and the checkpoints page show
        it (docs/CLI.md): its step, blue's generation, N, green's generation and progress,
        how it ended and whether green was rolled back after it."""
        progress, done = self.progress, self.done
        return {"id": self.id, "step": self.step, "blue_generation": self.plan.blue_generation,
                "after_batch": self.agreed.after_batch if self.agreed else None,
                "green_generation": self.claimed.generation if self.claimed else None,
                "outcome": done.outcome if done else None, "reason": done.reason if done else None,
                "created_at": self.plan.created_at,
                "rolled_back_at": self.rolled_back.at if self.rolled_back else None,
                "mode": self.plan.mode, "warmup_batch": self.plan.warmup_batch,
                "green_replayed_batch": progress.replayed_batch if progress else None,
                "ended_at": done.at if done else None, "ended_step": done.step if done else None,
                "blue_checkpoint": self.claimed.checkpoint if self.claimed else None,
                "blue_savepoint": self.claimed.savepoint if self.claimed else None,
                "rolled_back_to": self.rolled_back.restore if self.rolled_back else None}


_PARSERS: dict[str, Any] = {"plan": CutoverPlan.from_json, "green": CutoverProgress.from_json,
                            "agreed": CutoverAgreement.from_json, "claimed": CutoverClaim.from_json,
                            "done": CutoverEnd.from_json, "rollback": CutoverEnd.from_json}


class CutoverStore:
    """The cutover records of one job (see the module docstring)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.store = catalog.store

    # -- writing -------------------------------------------------------------------------

    def plan(self, plan: CutoverPlan) -> CutoverPlan:
        """Write `plan` (its id new).

        :raises CutoverError: another cutover of the job is open, or was planned at the same
            time (then this one is ended as aborted), or the id is taken.
        :raises ConfigError: the plan is for another job.
        """
        if plan.job != self.catalog.job:
            raise ConfigError(f"cutover plan {plan.id} is for job {plan.job!r}, not {self.catalog.job!r}")
        current = self.open_cutover()
        if current is not None:
            raise CutoverError(f"job {self.catalog.job!r} has cutover {current.id} open ({current.step}); "
                               "one cutover at a time: finish or call it off first")
        self._create(plan.id, "plan", plan.to_json())
        # The check and the write are two steps: a planner that finds another open plan
        # after its own write ends its own (both may; the orchestrator plans again), so at
        # most one goes on.
        other = self.open_cutover(besides=plan.id)
        if other is not None:
            why = f"cutover {other.id} was planned at the same time"
            self.end(plan.id, "aborted", step="plan", reason=why, by="plan")
            raise CutoverError(f"job {self.catalog.job!r}: {why} as {plan.id}; {plan.id} is called off "
                               "(one cutover at a time)")
        return plan

    def progress(self, progress: CutoverProgress) -> None:
        """Overwrite green's warm-up progress.

        :raises CutoverError: the cutover has no plan or is done.
        """
        self._require(progress.id, open_only=True)
        key = layout.cutover_key(progress.id, "green")
        body = json.dumps(progress.to_json(), sort_keys=True).encode()
        bounded.check_writable(body, layout.limits_of(key), f"{self.catalog.uri}/{key}")
        self.store.put(key, body)

    def agree(self, cutover_id: str, after_batch: int, request_id: str) -> CutoverAgreement:
        """Record the agreed batch N and blue's ``stop_after`` request.

        :raises CutoverError: no open plan, or already agreed.
        """
        self._require(cutover_id, open_only=True)
        faults.maybe_kill("cutover_agreement", after_batch)  # blue's request filed, not agreed yet
        agreement = CutoverAgreement(cutover_id, _int(after_batch, "after_batch"), str(request_id),
                                     time.time())
        self._create(cutover_id, "agreed", agreement.to_json())
        return agreement

    def claim(self, claim: CutoverClaim) -> CutoverClaim:
        """Record green's claim (after its checks).

        :raises CutoverError: not agreed, done, or already claimed.
        """
        state = self._require(claim.id, open_only=True)
        if state.agreed is None:
            raise CutoverError(f"cutover {claim.id} of job {self.catalog.job!r} is not agreed; "
                               "nothing to claim")
        self._create(claim.id, "claimed", claim.to_json())
        return claim

    def end(self, cutover_id: str, outcome: str, *, step: str, reason: str = "",
            generation: int | None = None, by: str = "") -> CutoverEnd:
        """End the cutover; the first end written holds, and is returned (a second writer
        gets the first's, so both see how it ended).

        :raises CutoverError: there is no such cutover.
        """
        self._require(cutover_id, open_only=False)
        record = CutoverEnd(cutover_id, outcome, step, reason, generation, by, time.time())
        return self._write_once(cutover_id, "done", record)

    def roll_back(self, cutover_id: str, *, generation: int, reason: str = "", by: str = "",
                  restore: str | None = None) -> CutoverEnd:
        """Record that green's generation `generation` of a claimed cutover was rolled back
        (its uncommitted output aborted, the job's lineage returned before it: to
        `restore`). The done
        record stays (a committed cutover stays committed: what green committed before the
        rollback is visible); it is written as ``rolled_back`` when none was. Written once:
        a second rollback gets the first's record.

        :raises CutoverError: no such cutover, it was never claimed, or by a generation
            after `generation` (a later generation that continues green's lineage, a
            restart of green's, is rolled back as green: `cutover_lineage.cutover_of_lineage`).
        """
        state = self._require(cutover_id, open_only=False)
        if state.claimed is None or state.claimed.generation > generation:
            claimed = state.claimed.generation if state.claimed else None
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} was claimed by generation "
                               f"{claimed}, not by {generation} or a generation before it: nothing of it to "
                               "roll back")
        if state.rolled_back is not None:
            return state.rolled_back
        self.end(cutover_id, "rolled_back", step="rollback", reason=reason, generation=generation, by=by)
        record = CutoverEnd(cutover_id, "rolled_back", "rollback", reason, generation, by, time.time(),
                            restore)
        return self._write_once(cutover_id, "rollback", record)

    def _write_once(self, cutover_id: str, part: str, record: CutoverEnd) -> CutoverEnd:
        """Write end record `part` (``done`` or ``rollback``) once: a second writer gets
        the first's record.

        :raises CutoverError: it could not be written, and none is there.
        """
        try:
            self._create(cutover_id, part, record.to_json())
        except CutoverError:
            state = self.read(cutover_id)
            existing = state.done if part == "done" else state.rolled_back
            if existing is None:
                raise
            return existing
        return record

    # -- reading -------------------------------------------------------------------------

    def read(self, cutover_id: str) -> CutoverState:
        """Every record of cutover `cutover_id`.

        :raises CutoverError: it has no plan, or its plan is unreadable or another job's.
        """
        _check_id(cutover_id)
        found: dict[str, Any] = {}
        errors = []
        for part, parse in _PARSERS.items():
            key = layout.cutover_key(cutover_id, part)
            try:
                found[part] = bounded.read_record(self.store, key, bounded.json_object(parse),
                                                  limits=layout.limits_of(key),
                                                  where=f"{self.catalog.uri}/{key}")
            except CorruptRecord as exc:
                if part in ("plan", "done"):  # the open/closed decision needs both
                    raise CutoverError(f"unreadable cutover record: {exc}") from None
                errors.append(str(exc))
                found[part] = None
        plan = found["plan"]
        if plan is None:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} has no plan under "
                               f"{self.catalog.uri}/{layout.CUTOVER}")
        if plan.id != cutover_id or plan.job != self.catalog.job:
            raise CutoverError(f"{self.catalog.uri}/{layout.cutover_key(cutover_id, 'plan')} holds cutover "
                               f"{plan.id!r} of job {plan.job!r}, not {cutover_id!r} of {self.catalog.job!r}")
        return CutoverState(plan, found["green"], found["agreed"], found["claimed"], found["done"],
                            tuple(errors), found["rollback"])

    def ids(self) -> list[str]:
        """Every cutover id with a plan, oldest first (one listing)."""
        ids = []
        for info in self.store.list(layout.CUTOVER):
            match = layout.CUTOVER_RE.match(info.key.rsplit("/", 1)[-1])
            if match and match.group(2) == "plan":
                ids.append(match.group(1))
        return sorted(ids)

    def newest(self, limit: int) -> list[CutoverState]:
        """The `limit` newest cutovers, newest first (one listing, then each one's records).

        :raises CutoverError: a plan or end record is unreadable (named).
        """
        return [self.read(cutover_id) for cutover_id in list(reversed(self.ids()))[:max(0, limit)]]

    def open_cutover(self, besides: str | None = None) -> CutoverState | None:
        """The open cutover of the job (a plan without a done record) other than
        `besides`, or None. Fails closed: an unreadable plan or end counts as open.

        :raises CutoverError: a cutover's plan or end is unreadable (named).
        """
        for cutover_id in reversed(self.ids()):  # the newest first: at most one is open
            if cutover_id == besides:
                continue
            state = self.read(cutover_id)
            if state.open:
                return state
        return None

    # -- the rules -----------------------------------------------------------------------

    def _require(self, cutover_id: str, *, open_only: bool) -> CutoverState:
        state = self.read(cutover_id)
        if open_only and state.done is not None:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} is done "
                               f"({state.done.outcome} at {state.done.step}: "
                               f"{state.done.reason or 'no reason'})")
        return state

    def _create(self, cutover_id: str, part: str, body: Mapping[str, Any]) -> None:
        key = layout.cutover_key(cutover_id, part)
        data = json.dumps(body, sort_keys=True).encode()
        bounded.check_writable(data, layout.limits_of(key), f"{self.catalog.uri}/{key}")
        try:
            self.store.put_if_absent(key, data)
        except ObjectExists:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} already has its {part} "
                               "record (written once)") from None
