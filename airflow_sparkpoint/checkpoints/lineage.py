"""Lineages (invariant 9): where each generation of a job started from.

Every generation writes one *origin* record right after it claimed the generation and
before any effect (``<job>/lineage/<generation>.json``, created once). ``base_id`` is the
id of the checkpoint of this job the generation restored (for a savepoint of this job:
the checkpoint it was copied from), or -1 for empty state and for another job's snapshot.

The one rule: checkpoint C is **superseded** iff some origin O has
``O.generation > C.generation and C.id > O.base_id``; ``superseded_by`` is the smallest
such generation. It covers a rewind to an older checkpoint, an explicit restore, a
blue-green rollback, ``restore=none`` with force, and a zombie's checkpoint completed
after a newer generation read "latest" (an id above the newer generation's base, from an
older generation). Superseded checkpoints are never chosen by ``restore=latest``.

``restore=latest`` (`restart_point`): with O* the origin of the newest generation that has
one, the newest valid, non-superseded checkpoint of a generation >= O*.generation; else
O*'s own origin (its checkpoint, its savepoint, or empty state) while it is still valid.
Stores written before lineages existed (no origin at all) resume from the newest valid
checkpoint, as before.

**A lineage never depends on what a stale deleter may still delete** (issue #27.3).
Retention checks its generation once and then deletes; storage has no conditional
delete, so a zombie's pass decided before a newer claim may land after it. What it
deletes was decided from the origins it read: checkpoints outside the newest
``numRetained`` restorable ones (and the newest lineage's base) *as it saw them*.
``restore=latest`` by the newer generation chooses, after its claim, from a superset of
what the zombie read and by the same rule, so it always lands inside the zombie's keep
set. A restore *by path* may choose any checkpoint, one the zombie is deleting: so that
generation owns its base before relying on it. Right after its claim and before its
origin it copies the checkpoint to ``pins/<generation>/`` (`Origin.pin`; no retention
pass deletes pins: they go with their origin, when it is pruned). Should the checkpoint
vanish (during the copy, the generation fails before its origin exists, so the old
lineage stays in force), the lineage restarts from its pin.

Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.exceptions import CorruptMetadata, RestoreError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry
    from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata

__all__ = ["KINDS", "SCHEMA_VERSION", "Origin", "RestartPoint", "damage_message", "mark_superseded",
           "new_origin", "prunable", "resolve_restart_point", "rollback_base", "superseded_by"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
KINDS = ("checkpoint", "savepoint", "empty")


@dataclass(frozen=True)
class Origin:
    """What one generation of a job started from (written once, right after its claim)."""

    generation: int
    kind: str  # "checkpoint" | "savepoint" | "empty"
    uri: str | None  # the restored snapshot; None for empty state
    base_id: int  # the restored checkpoint of this job (a savepoint's source), else -1
    snapshot_id: int | None = None  # the id of the restored snapshot, of any job
    batch_id: int | None = None  # the batch it restarts after; None for empty state
    #: the highest checkpoint id in use when the generation planned: checkpoints above it
    #: were written by this generation or later (or by a zombie, then superseded)
    id_floor: int = 0
    #: the restore settings it was planned with (restore, sink_ahead, allow_foreign_job, force)
    restore: Mapping[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    live_dir: str | None = None
    host: str = ""
    pid: int = 0
    #: a copy of the restored checkpoint owned by this generation (`Catalog.pin`), or None
    pin: str | None = None
    #: the generation that wrote checkpoint `base_id` (None: not recorded, a record of an
    #: earlier release): checkpoint ids are not tombstoned, so a fenced writer's late
    #: ``_metadata`` can land on the id after retention removed the base
    base_generation: int | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "generation": self.generation,
            "kind": self.kind,
            "uri": self.uri,
            "base_id": self.base_id,
            "snapshot_id": self.snapshot_id,
            "batch_id": self.batch_id,
            "id_floor": self.id_floor,
            "restore": dict(self.restore),
            "created_at": self.created_at,
            "live_dir": self.live_dir,
            "host": self.host,
            "pid": self.pid,
            "pin": self.pin,
            "base_generation": self.base_generation,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "origin") -> Origin:
        """:raises CorruptMetadata: not an origin record of a version this release reads."""
        try:
            version = int(data.get("schema_version", 1))
            if version > SCHEMA_VERSION:
                raise ValueError(f"schema_version {version}; this release reads <= {SCHEMA_VERSION}")
            kind = str(data["kind"])
            if kind not in KINDS:
                raise ValueError(f"kind {kind!r}")
            return cls(
                generation=int(data["generation"]),
                kind=kind,
                uri=None if data.get("uri") is None else str(data["uri"]),
                base_id=int(data["base_id"]),
                snapshot_id=None if data.get("snapshot_id") is None else int(data["snapshot_id"]),
                batch_id=None if data.get("batch_id") is None else int(data["batch_id"]),
                id_floor=int(data.get("id_floor", 0)),
                restore=dict(data.get("restore") or {}),
                created_at=float(data.get("created_at", 0.0)),
                live_dir=None if data.get("live_dir") is None else str(data["live_dir"]),
                host=str(data.get("host", "")),
                pid=int(data.get("pid", 0)),
                pin=None if data.get("pin") is None else str(data["pin"]),
                base_generation=None if data.get("base_generation") is None else int(data["base_generation"]),
                schema_version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMetadata(f"{where}: malformed origin record ({exc.__class__.__name__}: "
                                  f"{exc})") from None

    def describe(self) -> str:
        if self.kind == "empty":
            return f"empty state (generation {self.generation})"
        return f"{self.kind} {self.uri} (batch {self.batch_id}, restored by generation {self.generation})"


def new_origin(
    generation: int,
    *,
    kind: str,
    uri: str | None,
    base_id: int,
    snapshot_id: int | None,
    batch_id: int | None,
    id_floor: int,
    restore: Mapping[str, Any],
    live_dir: str | None,
    host: str,
    pid: int,
    pin: str | None = None,
    base_generation: int | None = None,
) -> Origin:
    return Origin(generation=generation, kind=kind, uri=uri, base_id=base_id, snapshot_id=snapshot_id,
                  batch_id=batch_id, id_floor=id_floor, restore=dict(restore), created_at=time.time(),
                  live_dir=live_dir, host=host, pid=pid, pin=pin, base_generation=base_generation)


def origin_base(origin: Origin, entry: SnapshotEntry) -> SnapshotEntry:
    """`entry` (checkpoint `origin.base_id` as listed) as the base `origin` restored: made
    invalid when its id now holds another generation's checkpoint, a fenced writer's late
    ``_metadata`` on an id that retention freed (ids are not tombstoned)."""
    meta = entry.metadata
    if meta is None or (meta.generation < origin.generation and (
            origin.base_generation is None or meta.generation == origin.base_generation)):
        return entry
    return replace(entry, metadata=None, written_by=meta.generation,
                   error=f"its id holds generation {meta.generation}'s checkpoint, not the one generation "
                         f"{origin.generation} restored (of generation {origin.base_generation})")


def superseded_by(generation: int, checkpoint_id: int, origins: Sequence[Origin]) -> int | None:
    """The smallest generation whose origin abandoned checkpoint (`checkpoint_id`, written
    by `generation`), or None while it is on a live lineage."""
    found = [o.generation for o in origins if o.generation > generation and checkpoint_id > o.base_id]
    return min(found) if found else None


def mark_superseded(entries: Sequence[SnapshotEntry], origins: Sequence[Origin]) -> list[SnapshotEntry]:
    """`entries` with ``superseded_by`` filled in for the valid checkpoints."""
    result = []
    for entry in entries:
        if entry.metadata is not None and entry.kind == "checkpoint":
            by = superseded_by(entry.metadata.generation, entry.id, origins)
            if by is not None:
                entry = replace(entry, superseded_by=by)
        result.append(entry)
    return result


def rollback_base(entries: Iterable[SnapshotEntry], generation: int,
                  first_uncommitted: int) -> SnapshotEntry | None:
    """The checkpoint a rollback of `generation` returns to (`services.rollback`): its newest
    restorable checkpoint before its batch `first_uncommitted`, whose output all stays.
    None when it has none: the rollback returns to where the generation started. Checkpoint
    retention keeps it (`retention.enforce_checkpoint_retention`)."""
    return max(
        (e for e in entries if e.restorable and e.metadata is not None and e.metadata.generation == generation
         and e.metadata.batch_id < first_uncommitted),
        key=lambda e: e.id, default=None,
    )


@dataclass(frozen=True)
class RestartPoint:
    """What ``restore=latest`` resumes from.

    Exactly one of: `checkpoint` (a checkpoint of this job in this catalog), `uri` (a
    snapshot to open by URI: the savepoint or foreign snapshot a lineage started from), or
    neither (empty state). `origin` is set when the answer is the newest lineage's own
    origin (it has no completed checkpoint of its own yet).
    """

    checkpoint: SnapshotMetadata | None
    uri: str | None
    origin: Origin | None
    description: str
    #: complete but invalid checkpoints skipped on the way (uri, reason)
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return self.checkpoint is None and self.uri is None


def damage_message(job: str, damaged: Sequence[SnapshotEntry], what: str) -> str:
    """The error for a store whose checkpoints are damaged and nothing is restorable."""
    listed = "; ".join(f"{e.uri}: {e.error}" for e in damaged[:5])
    more = f" (and {len(damaged) - 5} more)" if len(damaged) > 5 else ""
    return (
        f"job {job!r} has no restorable checkpoint: {what}. Damaged checkpoints: {listed}{more}. "
        "Nothing was started, so nothing is lost. See `sparkpoint list`; restore a "
        "savepoint or checkpoint by "
        "path (spark.sparkpoint.restore=<path>), or start with empty state on purpose with "
        "spark.sparkpoint.restore=none and spark.sparkpoint.restore.force=true"
    )


def resolve_restart_point(
    job: str,
    ids: Sequence[int],
    origins: Sequence[Origin],
    read: Callable[[int], SnapshotEntry],
) -> RestartPoint:
    """The rule of ``restore=latest`` over checkpoint `ids` (ascending), the job's
    `origins` (by generation) and `read(id)`, which validates one checkpoint.

    :raises RestoreError: see `Catalog.restart_point`.
    """
    newest = origins[-1] if origins else None
    damaged: list[SnapshotEntry] = []
    entries: dict[int, SnapshotEntry] = {}

    def entry_of(cid: int) -> SnapshotEntry:
        if cid not in entries:
            entries[cid] = read(cid)
        return entries[cid]

    def skipped() -> tuple[tuple[str, str], ...]:
        return tuple((e.uri, str(e.error)) for e in damaged)

    for cid in reversed(ids):
        entry = entry_of(cid)
        if entry.metadata is None:
            if entry.written_by is not None and superseded_by(entry.written_by, cid, origins) is not None:
                # A fenced writer's late checkpoint on an abandoned lineage (its id may be
                # one retention freed, its files collected): never a restore target.
                log.info("ignoring invalid checkpoint %s of superseded generation %d: %s", entry.uri,
                         entry.written_by, entry.error)
                continue
            if entry.error and "no _metadata" not in entry.error:
                log.warning("skipping invalid checkpoint %s: %s; falling back to an older one", entry.uri,
                            entry.error)
                damaged.append(entry)
            continue
        meta = entry.metadata
        if superseded_by(meta.generation, cid, origins) is not None:
            continue
        if newest is None or meta.generation >= newest.generation:
            return RestartPoint(meta, None, None, f"latest checkpoint {entry.uri} (batch {meta.batch_id})",
                                skipped())
        break  # older than the newest lineage: that lineage has no checkpoint of its own yet
    if newest is None:
        if damaged:
            raise RestoreError(damage_message(job, damaged, "every completed checkpoint is damaged"))
        return RestartPoint(None, None, None, "empty state (no completed checkpoint yet)")
    lineage = f"the lineage of generation {newest.generation}"
    if newest.kind == "empty":
        own = [e for e in damaged if e.id > newest.id_floor]
        if own:
            raise RestoreError(damage_message(job, own, f"{lineage} started from empty "
                                                        "state and its checkpoints "
                                                        "are damaged"))
        return RestartPoint(None, None, newest,
                            f"empty state ({lineage} started empty and has no completed checkpoint yet)",
                            skipped())
    if newest.kind == "checkpoint" and newest.base_id >= 0:
        base = origin_base(newest, entry_of(newest.base_id))
        if base.metadata is not None:
            return RestartPoint(base.metadata, None, newest,
                                f"checkpoint {base.uri} (batch {base.metadata.batch_id}: "
                                f"{lineage} started there "
                                "and has no completed checkpoint yet)", skipped())
        log.warning("checkpoint %s, where %s started, is not usable: %s", base.uri, lineage, base.error)
        if newest.pin is not None:
            # The lineage owns a copy of it (a restore by path; a stale retention pass may
            # have deleted the checkpoint itself): the same state, never collected.
            return RestartPoint(None, newest.pin, newest,
                                f"{newest.pin}, the copy of checkpoint {base.uri} (batch "
                                f"{newest.batch_id}) that "
                                f"{lineage} started from and owns; it has no completed checkpoint yet",
                                skipped())
        # Its origin is damaged: like any damaged checkpoint, fall back to an older one of
        # the same lineage (the sink-ahead check still guards the output).
        if all(e.id != base.id for e in damaged):
            damaged.append(base)
        for cid in reversed([i for i in ids if i < newest.base_id]):
            entry = entry_of(cid)
            if entry.metadata is not None and superseded_by(entry.metadata.generation, cid, origins) is None:
                return RestartPoint(entry.metadata, None, None,
                                    f"checkpoint {entry.uri} (batch {entry.metadata.batch_id}: the newest "
                                    f"usable one of {lineage})", skipped())
        raise RestoreError(damage_message(job, damaged, f"checkpoint {base.uri}, where {lineage} started, is "
                                                        "damaged and no older checkpoint of that lineage is "
                                                        "left"))
    return RestartPoint(None, newest.uri, newest,
                        f"{newest.kind} {newest.uri} (batch {newest.batch_id}: {lineage} "
                        "started there and has no "
                        "completed checkpoint yet)", skipped())


def prunable(origins: Sequence[Origin], checkpoints: Sequence[SnapshotMetadata]) -> list[Origin]:
    """Origins that no longer matter: not the newest one, and superseding none of
    `checkpoints` (every checkpoint left in the store). Future checkpoints come from the
    newest generation (never superseded by an older origin) or from zombies, which the
    newest origin supersedes on its own."""
    if not origins:
        return []
    newest = max(origins, key=lambda o: o.generation)
    return [
        o for o in origins
        if o is not newest and not any(c.generation < o.generation and c.id > o.base_id for c in checkpoints)
    ]
