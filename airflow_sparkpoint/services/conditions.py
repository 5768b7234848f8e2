"""When a Sparkpoint wait is over: the one condition function shared by
`SparkpointCheckpointSensor` (poke mode) and `SparkpointCheckpointTrigger` (deferrable,
through `ConditionWatch`, which reads less while nothing moved).

Pure Python over a `Catalog`: no Airflow, no Spark. What the store holds is read through
the history model (`checkpoints.history`). `evaluate` answers one of three ways::

    done      the condition holds; `Outcome.payload` describes the snapshot (JSON-safe)
    failed    it can never hold: the job failed, its generation was superseded, it died
              (stale heartbeat) or ended before the condition was met; `Outcome.error`
    waiting   neither yet; `Outcome.waiting_for` says what is missing (for the log)

What "the job" means: the run of `generation` when one is given, else the job's
current (newest claimed) generation.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import durations
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.history import (
    SnapshotRecord,
    generation_alive,
    iso,
    read_job_status,
    snapshot_records,
)
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.status import JobStatus, current_of, current_status
from airflow_sparkpoint.exceptions import ConfigError

__all__ = [
    "FULL_LOOK_S", "JITTER", "CheckpointCondition", "ConditionWatch", "Observation", "Outcome", "decide",
    "epoch_seconds", "evaluate", "generation_alive", "observe", "optional_int", "optional_seconds",
    "status_mark",
]

#: a watch's full look at the job, at least this often (seconds; see `ConditionWatch`)
FULL_LOOK_S = 300.0
#: how much a watch's next full look varies (a fraction: see `ConditionWatch`)
JITTER = 0.2

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog


# ---------------------------------------------------------------------------- values


def optional_int(name: str, value: Any, *, minimum: int = 0) -> int | None:
    """`value` as an int >= `minimum`, or None; strings from templates are parsed.

    :raises ConfigError: anything else (the message names `name` and the value).
    """
    if value is None:
        return None
    number = value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
    if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
        raise ConfigError(f"{name}={value!r} is invalid; expected an integer >= {minimum} or None")
    return number


def optional_seconds(name: str, value: Any, *, allow_zero: bool = False) -> float | None:
    """`value` as finite seconds > 0 (>= 0 with `allow_zero`), or None: a timedelta, a
    number or a duration string (`airflow_sparkpoint.durations`, the one parser).

    :raises ConfigError: anything else.
    """
    return durations.optional_seconds(name, value, allow_zero=allow_zero)


def epoch_seconds(name: str, value: Any) -> float | None:
    """A point in time as epoch seconds: a datetime (naive means UTC), a number, or a
    string holding either (an ISO 8601 timestamp from a template); None stays None.

    :raises ConfigError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            return epoch_seconds(name, float(text))
        except ValueError:
            pass
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{name}={value!r} is invalid; expected a datetime, epoch seconds or an ISO 8601 timestamp"
            ) from None
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return aware.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is invalid; expected a datetime, epoch seconds "
                          "or an ISO 8601 timestamp")
    return float(value)


def _iso(epoch: float | None) -> str:
    return iso(epoch) or "never"


# ---------------------------------------------------------------------------- the condition


@dataclass(frozen=True)
class CheckpointCondition:
    """What to wait for. Every filter given must hold (they combine with AND).

    :param job_name: the pipeline.
    :param after_checkpoint_id: only snapshots with a larger id count.
    :param after_time: only snapshots completed after this (epoch seconds) count.
    :param generation: only snapshots of this generation count; the wait fails when a
        newer generation supersedes it before the condition holds.
    :param min_checkpoints: how many matching snapshots must exist. Retained checkpoints
        are counted, and, for `generation`, the run's own count from its status record
        (so N may exceed ``numRetained``).
    :param savepoint: wait for completed savepoints instead of checkpoints.
    :param progress_within: also require healthy progress: the run's heartbeat and its
        newest matching checkpoint are both younger than this many seconds.
    :param max_heartbeat_age: a running job whose heartbeat is older has died.
    """

    job_name: str
    after_checkpoint_id: int | None = None
    after_time: float | None = None
    generation: int | None = None
    min_checkpoints: int = 1
    savepoint: bool = False
    progress_within: float | None = None
    max_heartbeat_age: float = 60.0

    def __post_init__(self) -> None:
        layout.validate_job_name(self.job_name)
        optional_int("after_checkpoint_id", self.after_checkpoint_id, minimum=0)
        if self.after_time is not None and (
            isinstance(self.after_time, bool)
            or not isinstance(self.after_time, (int, float))
            or not math.isfinite(self.after_time)
        ):
            raise ConfigError(f"after_time={self.after_time!r} is invalid; expected epoch "
                              "seconds (a number) or None")
        optional_int("generation", self.generation, minimum=1)
        if optional_int("min_checkpoints", self.min_checkpoints, minimum=1) is None:
            raise ConfigError("min_checkpoints=None is invalid; expected an integer >= 1")
        if not isinstance(self.savepoint, bool):
            raise ConfigError(f"savepoint={self.savepoint!r} is invalid; expected True or False")
        # Any duration form, kept as seconds (the trigger serializes the condition's fields).
        object.__setattr__(self, "progress_within", optional_seconds("progress_within", self.progress_within))
        object.__setattr__(self, "max_heartbeat_age",
                           durations.seconds("max_heartbeat_age", self.max_heartbeat_age))
        if self.savepoint and self.progress_within is not None:
            raise ConfigError(
                f"progress_within={self.progress_within!r} cannot be combined with savepoint=True; "
                "healthy progress is measured by checkpoints (use two sensors)"
            )

    @property
    def kind(self) -> str:
        return "savepoint" if self.savepoint else "checkpoint"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """E.g. '2 completed checkpoints of generation 3 of job 'orders' newer than chk-5'."""
        what = f"{self.min_checkpoints} completed {self.kind}s" if self.min_checkpoints > 1 else \
            f"a completed {self.kind}"
        parts = [what]
        if self.generation is not None:
            parts.append(f"of generation {self.generation}")
        parts.append(f"of job {self.job_name!r}")
        if self.after_checkpoint_id is not None:
            parts.append(f"newer than id {self.after_checkpoint_id}")
        if self.after_time is not None:
            parts.append(f"completed after {_iso(self.after_time)}")
        if self.progress_within is not None:
            parts.append(f"with heartbeat and last checkpoint younger than {self.progress_within:g} s")
        return " ".join(parts)


@dataclass(frozen=True)
class Outcome:
    """The answer of `evaluate` (see the module docstring)."""

    done: bool
    payload: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    waiting_for: str = ""

    @property
    def failed(self) -> bool:
        return self.error is not None


def _matches(catalog: Catalog, cond: CheckpointCondition) -> list[tuple[str, Snapshot]]:
    """(uri, figures) of every valid snapshot passing the filters, newest first (the
    figures of a listing, `snapshot_records`: never every snapshot's files at once)."""
    result = []
    for record in snapshot_records(catalog, cond.kind, drills=False):
        meta = _Figures.of(record)
        if meta is None:
            continue
        if cond.after_checkpoint_id is not None and meta.id <= cond.after_checkpoint_id:
            continue
        if cond.after_time is not None and meta.created_at <= cond.after_time:
            continue
        if cond.generation is not None and meta.generation != cond.generation:
            continue
        result.append((record.uri, meta))
    return sorted(result, key=lambda pair: (pair[1].created_at, pair[1].id), reverse=True)


@dataclass(frozen=True)
class _Figures:
    """What a condition reads of a valid snapshot (the fields of its metadata it names)."""

    id: int
    generation: int
    batch_id: int
    created_at: float
    source_checkpoint: int | None

    @classmethod
    def of(cls, record: SnapshotRecord) -> _Figures | None:
        if (not record.valid or record.generation is None or record.batch_id is None
                or record.created_at is None):
            return None
        return cls(record.id, record.generation, record.batch_id, record.created_at, record.source_checkpoint)


#: a matching snapshot's figures: `_Figures`, or its `SnapshotMetadata` (same fields)
Snapshot = _Figures | SnapshotMetadata


def _payload(cond: CheckpointCondition, uri: str, meta: Snapshot, count: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "kind": cond.kind,
        "job": cond.job_name,
        "generation": meta.generation,
        "batch_id": meta.batch_id,
        "created_at": meta.created_at,
        "count": count,
    }
    if cond.savepoint:
        payload.update(savepoint_id=meta.id, savepoint_uri=uri, source_checkpoint=meta.source_checkpoint)
    else:
        payload.update(checkpoint_id=meta.id, checkpoint_uri=uri)
    return payload


@dataclass(frozen=True)
class Observation:
    """What `evaluate` reads from the store; `decide` is the pure rest.

    `current` is the newest claimed generation, `status` the job's status record and
    `matches` every valid snapshot passing the filters, newest first (`_matches`).
    """

    current: int
    status: JobStatus | None
    matches: tuple[tuple[str, Snapshot], ...]


def observe(catalog: Catalog, cond: CheckpointCondition,
            status: JobStatus | None | EllipsisType = ...) -> Observation:
    """One full look at the job: two listings, the status record (unless the caller
    just read ``status.json``: `status`; the current generation's own record when
    ``status.json`` is older, `current_of`) and the metadata of every retained snapshot (cost
    O(retained snapshots))."""
    if isinstance(status, EllipsisType):
        status, current = current_status(catalog)
    else:
        current = catalog.current_generation()
        status = current_of(catalog, status, current)
    return Observation(current, status, tuple(_matches(catalog, cond)))


def status_mark(status: JobStatus | None) -> tuple[Any, ...] | None:
    """The fields of a status record that move when the job's snapshots or its run do:
    generation, state, last checkpoint, checkpoint count, savepoint, error — not the
    heartbeat. A running job rewrites its status after every completed checkpoint, so an
    unchanged mark means no checkpoint of the current run completed since."""
    if status is None:
        return None
    return (status.generation, status.state, status.last_checkpoint_id, status.checkpoints_completed,
            status.savepoint_uri, status.error)


def evaluate(catalog: Catalog, cond: CheckpointCondition, *, now: float | None = None) -> Outcome:
    """Whether `cond` holds for `catalog`'s job now, can never hold, or may still hold."""
    return decide(cond, observe(catalog, cond), now=now)


def decide(cond: CheckpointCondition, seen: Observation, *, now: float | None = None) -> Outcome:
    """`evaluate` on what was read (pure: no store access)."""
    now = time.time() if now is None else now
    current, status = seen.current, seen.status
    target = cond.generation if cond.generation is not None else current
    run = status if status is not None and status.generation == target else None

    matches = seen.matches
    count = len(matches)
    if (
        run is not None
        and not cond.savepoint
        and cond.generation is not None
        and cond.after_checkpoint_id is None
        and cond.after_time is None
    ):
        count = max(count, run.checkpoints_completed)
    missing: list[str] = []
    if not matches or count < cond.min_checkpoints:
        missing.append(f"{count}/{cond.min_checkpoints} matching {cond.kind}s")
    if cond.progress_within is not None:
        if run is None or run.state not in ("starting", "running"):
            missing.append("a running job")
        else:
            if now - run.heartbeat_at > cond.progress_within:
                missing.append(f"a heartbeat younger than {cond.progress_within:g} s "
                               f"(it is {now - run.heartbeat_at:.0f} s old)")
            if matches and now - matches[0][1].created_at > cond.progress_within:
                missing.append(f"a checkpoint younger than {cond.progress_within:g} s "
                               f"(the newest is {now - matches[0][1].created_at:.0f} s old)")
    if not missing:
        uri, meta = matches[0]
        return Outcome(True, _payload(cond, uri, meta, count))

    waiting_for = f"{cond.describe()}: missing {', '.join(missing)}"
    what = f"generation {target} of job {cond.job_name!r}"
    if cond.generation is not None and current > cond.generation:
        return Outcome(False, error=(
            f"{what} was superseded by generation {current} before {cond.describe()} completed"
        ))
    if status is None or status.generation < target:
        return Outcome(False, waiting_for=f"{waiting_for} ({what} has not reported a status yet)")
    if run is None:  # the status belongs to a newer generation than the one waited for
        return Outcome(False, error=f"{what} was superseded by generation {status.generation}")
    if run.state == "failed":
        return Outcome(False, error=f"{what} failed: {run.error or 'no error recorded'} (see its driver log)")
    if run.state in ("finished", "stopped"):
        if cond.generation is None and cond.after_time is not None and run.heartbeat_at < cond.after_time:
            # The final state of an earlier run: wait for the next one to start.
            return Outcome(False, waiting_for=f"{waiting_for} (the last run {run.state} at "
                                              f"{_iso(run.heartbeat_at)})")
        return Outcome(False, error=(
            f"{what} {run.state} at {_iso(run.heartbeat_at)} before {cond.describe()} completed "
            f"(missing {', '.join(missing)})"
        ))
    age = now - run.heartbeat_at
    if age > cond.max_heartbeat_age:
        return Outcome(False, error=(
            f"{what} is {run.state} but its heartbeat is {age:.0f} s old (max {cond.max_heartbeat_age:g} s): "
            f"the driver died or hangs (host {run.host or '?'}, pid {run.pid or '?'})"
        ))
    return Outcome(False, waiting_for=waiting_for)


class ConditionWatch:
    """`evaluate` for a waiter that looks again and again (the trigger: hundreds may wait
    on one store at once): each look reads the job's status record (plus the savepoint
    directory listing when it waits for a savepoint) and reuses the last full look while
    they did not move. The running job rewrites that record after every completed
    checkpoint, so the full look (listings and every retained snapshot's metadata) runs
    only when the record moved (`status_mark`), and at least every `FULL_LOOK_S` (or
    `poll_interval`, when longer; randomly earlier by up to `JITTER`) for what moves
    without it (a generation claimed by a run that died before its first status,
    deletions)."""

    def __init__(self, condition: CheckpointCondition, poll_interval: float) -> None:
        self.condition = condition
        self.poll_interval = poll_interval
        #: the last full look, its gate (status mark, savepoint directories) and when the next is due
        self.seen: Observation | None = None
        self._seen_gate: tuple[Any, ...] | None = None
        self._full_look_at = 0.0

    def look(self, catalog: Catalog, *, now: float | None = None) -> Outcome:
        """Whether the condition holds now (see the class docstring for what is read)."""
        now = time.time() if now is None else now
        status = read_job_status(catalog)
        seen = self.seen
        if seen is not None:
            # A GET more only when status.json is older than the run last seen (a zombie's late heartbeat).
            status = current_of(catalog, status, seen.current)
        gate: tuple[Any, ...] = (status_mark(status),)
        if self.condition.savepoint:
            gate += (tuple(sorted(catalog.store.list_dirs(layout.SAVEPOINTS))),)
        if seen is None or gate != self._seen_gate or now >= self._full_look_at:
            # the status just read: no second GET of status.json
            seen = observe(catalog, self.condition, status)
            # The gate read before the look: a change in between is seen at the next look.
            self._seen_gate = gate
            self._full_look_at = now + max(FULL_LOOK_S, self.poll_interval) * random.uniform(1 - JITTER, 1)
        else:
            # Only the heartbeat moved; a newer run's status also means its generation exists.
            current = max(seen.current, status.generation if status is not None else 0)
            seen = replace(seen, status=status, current=current)
        self.seen = seen
        return decide(self.condition, seen, now=now)
