"""Retention: checkpoints (``numRetained``, reference-counted shared files, the deletion
journal) and savepoint history.

Checkpoint retention (`enforce_checkpoint_retention`, called by the coordinator after each checkpoint)
keeps the newest ``numRetained`` *restorable* checkpoints (valid and not superseded),
deletes older and superseded ones, and deletes shared files that no kept checkpoint
references once they are older than a grace period (a checkpoint being written elsewhere,
say by a newer generation while this one is a zombie, has uploaded files nobody references
yet). Shared files are journaled before they are deleted (``gc/``) so that a checkpoint
being completed can see that a file it references went. Savepoints are never touched.

Savepoint history retention is like the Flink Kubernetes operator's
``kubernetes.operator.savepoint.history.max.count`` / ``.max.age``: keep at most
`max_count` of them and none older than `max_age_s`, but always keep the newest valid one,
so a deploy can still roll back, and those the job relies on (`relied_on_savepoints`): the
one the job's newest lineage started from (a ``restore=latest`` may restart there), and
blue's final savepoint of a zero-downtime cutover while a rollback of green's generation
returns there (`cutover_lineage.cutover_savepoints`). The operator's history
retention and ``sparkpoint dispose --keep/--older-than`` both use it.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.catalog_types import RetentionResult, SnapshotEntry
from airflow_sparkpoint.checkpoints.cutover_lineage import cutover_savepoints
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.lineage import mark_superseded, prunable, rollback_base
from airflow_sparkpoint.exceptions import (
    ConfigError,
    CorruptRecord,
    InvalidPath,
    RestoreError,
)

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.lineage import Origin
    from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
    from airflow_sparkpoint.storage.base import ObjectInfo

__all__ = ["INCOMPLETE_GRACE_S", "JOURNAL_DELETE_WITHIN_S", "JOURNAL_KEYS_PER_ENTRY", "JOURNAL_LOOKBACK_S",
           "JOURNAL_MIN_TTL_S", "ORPHAN_COLLECTION_FRACTION", "WHY_ORIGIN", "KnownRecords", "deleted_since",
           "enforce_checkpoint_retention", "journal_deletions", "prune_journal", "relied_on_savepoints",
           "savepoint_history_retention"]

log = logging.getLogger(__name__)

#: an incomplete savepoint directory (no ``_metadata``) younger than this may still be
#: being written; older ones are abandoned copies and are removed
INCOMPLETE_GRACE_S = 3600.0


#: journal entries older than this are pruned; they only need to cover the moment between
#: a checkpoint's check of its shared files and its ``_metadata`` (bounded by the timeout)
JOURNAL_MIN_TTL_S = 3600.0
#: how far back a checkpoint being completed reads the deletion journal (seconds before
#: its listing of ``shared/``), and how soon after its entry a pass must delete: a pass
#: whose deletion would come later deletes nothing (`enforce_checkpoint_retention`), so a
#: deletion the reader missed in the journal was in its listing's absence
JOURNAL_LOOKBACK_S = 60.0
JOURNAL_DELETE_WITHIN_S = 30.0
#: a writer's passes (`KnownRecords`) collect orphaned shared files at most once per this
#: fraction of the grace period, not at every checkpoint: each collection writes a journal
#: entry that every checkpoint lists until it is pruned (one an hour at a 3 s trigger made
#: 1,200 entries to list); an orphan then waits at most 1.1 × the grace period
ORPHAN_COLLECTION_FRACTION = 0.1
#: shared keys one deletion journal entry lists at most (~100 bytes each: a few MiB)
JOURNAL_KEYS_PER_ENTRY = 50_000


@dataclass
class KnownRecords:
    """Records one writer (the coordinator) already holds, so that a retention pass and the
    check before ``_metadata`` cost the same requests at the 50th checkpoint as at the 5th,
    and with 20 checkpoints retained as with 3 (issue 32).

    Each is created once and never rewritten (``_metadata`` and origins by atomic create,
    checkpoint ids never reused; journal entries under unique keys), so a copy read or
    written before is still what the store holds *if it still exists*: every pass lists
    first and uses a remembered record only for a key the listing shows (never trusting
    more than the listing) and forgets the rest. Shared files are still checked against
    each pass's listing. Lives in memory only: a restarted driver reads each record once.
    """

    #: checkpoint id -> its ``_metadata``, written by this writer or read and parsed before
    checkpoints: dict[int, SnapshotMetadata] = field(default_factory=dict)
    #: lineage key -> origin record
    origins: dict[str, Origin] = field(default_factory=dict)
    #: journal key -> the shared keys it lists
    journal: dict[str, frozenset[str]] = field(default_factory=dict)
    #: checkpoint ids this writer deleted whose (empty) directory a store may go on listing
    #: (SeaweedFS keeps empty folders for a while): not read, listed or deleted again
    deleted: set[int] = field(default_factory=set)
    #: when this writer's passes last collected orphaned shared files (epoch seconds)
    orphans_collected_at: float = 0.0


def enforce_checkpoint_retention(
    catalog: Catalog,
    num_retained: int,
    *,
    grace_seconds: float = 0.0,
    on_deleted: Callable[[int, int], None] | None = None,
    generation: int | None = None,
    shared_listing: Iterable[ObjectInfo] | None = None,
    before_delete: Callable[[], object] | None = None,
    known: KnownRecords | None = None,
    journal_listing: Iterable[ObjectInfo] | None = None,
    checkpoint_ids: Iterable[int] | None = None,
) -> RetentionResult:
    """Keep the newest `num_retained` restorable checkpoints; delete older and superseded
    ones, and shared files no kept checkpoint references.

    Incomplete ``chk-*`` directories older than the newest kept checkpoint are garbage;
    newer ones may be in progress and stay. While the newest lineage has no checkpoint of
    its own, the checkpoint it started from is kept too. Shared files younger than
    `grace_seconds` are kept; with `known` (one writer's passes), orphans are collected
    at most once per `ORPHAN_COLLECTION_FRACTION` of `grace_seconds`. `shared_listing` is
    a listing of ``shared/`` taken before (the coordinator's, from its check before
    ``_metadata``); a file uploaded after the listing is never collected. `generation`, when given, is checked
    right before
    anything is deleted. `on_deleted(done, total)` is called after each checkpoint deleted,
    `before_delete()` after that check, before the first checkpoint is deleted (the
    runtime's pause point). `known` (updated here): records held from before, not read
    again (`KnownRecords`); `journal_listing`: a listing of ``gc/`` taken before, used to
    prune the journal (an entry written after it is pruned by a later pass);
    `checkpoint_ids`: the ``chk-*`` ids listed before plus those the caller completed
    since (a directory created after that listing waits for a later pass).

    :raises ConfigError: `num_retained` or `grace_seconds` is invalid.
    :raises StaleGeneration: `generation` is no longer the current one.
    """
    if isinstance(num_retained, bool) or not isinstance(num_retained, int) or num_retained < 1:
        raise ConfigError(f"checkpoint numRetained={num_retained!r} is invalid; expected an integer >= 1")
    if (isinstance(grace_seconds, bool) or not isinstance(grace_seconds, (int, float))
            or not grace_seconds >= 0):
        raise ConfigError(f"retention grace_seconds={grace_seconds!r} is invalid; expected seconds >= 0")
    snapshots, origin_store = catalog.snapshot_store, catalog.origin_store
    ids = snapshots.checkpoint_ids() if checkpoint_ids is None else sorted(set(checkpoint_ids))
    if known is not None:  # ids are never reused: a deleted one listed again is an empty directory
        known.deleted &= set(ids)
        ids = [cid for cid in ids if cid not in known.deleted]
    if shared_listing is not None:
        shared = list(shared_listing)
    else:
        shared = list(catalog.store.list(layout.SHARED)) if ids else []
    present = {info.key: info.size for info in shared}
    origins = origin_store.read(known.origins if known is not None else None)
    cached = known.checkpoints if known is not None else {}
    entries = mark_superseded(
        [snapshots.checkpoint_entry(cid, present, cached.get(cid)) for cid in reversed(ids)],
        origins,
    )
    if known is not None:  # only what this listing shows, parsed: a pass never trusts more
        known.checkpoints = {e.id: e.metadata for e in entries if e.metadata is not None}
    keep = [e for e in entries if e.restorable][:num_retained]
    for point in _lineage_points(catalog, entries, keep, origins[-1] if origins else None):
        if point not in keep:
            keep.append(point)
    keep_ids = {e.id for e in keep}
    newest_kept = max(keep_ids, default=None)
    doomed = [
        e for e in entries
        if e.id not in keep_ids and (e.valid or (newest_kept is not None and e.id < newest_kept))
    ]
    fence = Fence(catalog, generation)  # unfenced without a generation
    fenced = False
    if doomed:
        fence.check()
        fenced = True  # once per pass, before its first deletion (see `lineage`)
    if doomed and before_delete is not None:
        before_delete()
    deleted_ids = []
    for entry in doomed:
        snapshots.delete_checkpoint(entry.key)
        deleted_ids.append(entry.id)
        if known is not None:
            known.checkpoints.pop(entry.id, None)
            known.deleted.add(entry.id)
        if on_deleted is not None:  # progress; the runtime's fault hook
            on_deleted(len(deleted_ids), len(doomed))
    referenced: set[str] = set()
    for entry in keep:
        assert entry.metadata is not None
        referenced.update(ref.key for ref in entry.metadata.files)
    now = time.time()
    orphans = []
    orphan_bytes = 0
    collect = known is None or now - known.orphans_collected_at >= grace_seconds * ORPHAN_COLLECTION_FRACTION
    for info in shared if collect else ():
        if info.key in referenced or (grace_seconds and now - info.mtime < grace_seconds):
            continue
        orphans.append(info.key)
        orphan_bytes += info.size
    # Without any kept checkpoint nothing is provably an orphan of a finished one.
    if keep and orphans:
        if not fenced:
            fence.check()
        journaled = time.monotonic()
        journal_deletions(catalog, orphans, generation, known)
        # A checkpoint being completed reads the journal `JOURNAL_LOOKBACK_S` back: a pass
        # that stalled longer since its entry deletes nothing (the next pass journals
        # again), and a superseded one never (the generation is checked right before).
        if time.monotonic() - journaled > JOURNAL_DELETE_WITHIN_S:
            log.warning("retention of job %s stalled %.0f s after journaling %d shared "
                        "files; not deleting them "
                        "now (the next pass does)", catalog.job, time.monotonic() - journaled, len(orphans))
            orphans, orphan_bytes = [], 0
        else:
            fence.check()
            catalog.store.delete(orphans)
            if known is not None:
                known.orphans_collected_at = now
    elif not keep:
        orphans, orphan_bytes = [], 0
    if keep:
        left = [e.metadata for e in entries if e.id not in set(deleted_ids) and e.metadata is not None]
        stale = prunable(origins, left)
        if stale:
            origin_store.delete(stale, kept=[o for o in origins if o not in stale])
        prune_journal(catalog, now - max(JOURNAL_MIN_TTL_S, 2 * grace_seconds), journal_listing, known)
    return RetentionResult(tuple(deleted_ids), len(orphans), orphan_bytes)


def _lineage_points(catalog: Catalog, entries: list[SnapshotEntry], keep: list[SnapshotEntry],
                    newest: Origin | None) -> list[SnapshotEntry]:
    """Checkpoints kept beyond the newest ``numRetained``: where the newest lineage
    restarts while it has no checkpoint of its own, and where a rollback of its generation
    returns to while that generation has recorded transactions (`lineage.rollback_base`;
    in external commit mode all of its checkpoints may hold uncommitted batches)."""
    if newest is None:
        return []
    base = None
    if newest.kind == "checkpoint" and newest.base_id >= 0:
        base = next((e for e in entries if e.id == newest.base_id and e.valid), None)
    points = []
    if base is not None and not any(
        e.metadata is not None and e.metadata.generation >= newest.generation for e in keep
    ):
        points.append(base)
    pending = [batch for batch, generation in catalog.transaction_keys() if generation == newest.generation]
    if pending:
        point = rollback_base(entries, newest.generation, min(pending)) or base
        if point is not None:
            points.append(point)
    return points


def journal_deletions(catalog: Catalog, keys: Iterable[str], generation: int | None,
                      known: KnownRecords | None = None) -> None:
    """Write-ahead record of shared files about to be deleted, so that a checkpoint being
    completed elsewhere notices that a file it references went (and copies it again).
    One entry per `JOURNAL_KEYS_PER_ENTRY` keys: every entry stays within the limits its
    readers accept (`layout.limits_of`).

    :raises CatalogError: an entry would still be over its limits (keys of absurd length).
    """
    keys = sorted(keys)
    for start in range(0, len(keys), JOURNAL_KEYS_PER_ENTRY):
        chunk = keys[start:start + JOURNAL_KEYS_PER_ENTRY]
        now = time.time()
        body = json.dumps({"generation": generation, "at": now, "keys": chunk}).encode()
        key = layout.gc_key(int(now * 1000), uuid.uuid4().hex[:8])
        bounded.check_writable(body, layout.limits_of(key), f"{catalog.uri}/{key}")
        catalog.store.put(key, body)
        if known is not None:
            known.journal[key] = frozenset(chunk)


def _journal_keys(raw: Any) -> frozenset[str]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"a JSON {type(raw).__name__}, not an object")
    return frozenset(str(k) for k in raw.get("keys", ()))


def _journal_time(key: str) -> float | None:
    """When the journal entry at `key` was written (epoch seconds), None if not one."""
    match = layout.GC_RE.match(key.rsplit("/", 1)[-1])
    return int(match.group(1)) / 1000 if match else None


def deleted_since(catalog: Catalog, since: float, known: KnownRecords | None = None,
                  listing: Iterable[ObjectInfo] | None = None) -> set[str]:
    """Shared keys whose deletion was journaled at or after `since` (epoch seconds).

    `listing`: a listing of ``gc/`` taken by the caller (else one is taken). `known`
    (updated here): entries read or written before are not read again."""
    keys: set[str] = set()
    for info in catalog.store.list(layout.GC) if listing is None else listing:
        at = _journal_time(info.key)
        if at is None or at < since:
            continue
        if known is not None and info.key in known.journal:
            keys.update(known.journal[info.key])
            continue
        try:
            entry = bounded.read_record(catalog.store, info.key, _journal_keys,
                                        limits=layout.limits_of(info.key), where=f"{catalog.uri}/{info.key}")
        except CorruptRecord as exc:
            log.warning("skipping unreadable deletion journal entry %s", exc)
            continue
        if entry is None:
            continue  # pruned meanwhile
        keys.update(entry)
        if known is not None:
            known.journal[info.key] = entry
    if known is not None:  # `since` only moves on: older entries are never needed again
        for old in [k for k in known.journal if (_journal_time(k) or 0.0) < since]:
            del known.journal[old]
    return keys


def prune_journal(catalog: Catalog, older_than: float, listing: Iterable[ObjectInfo] | None = None,
                  known: KnownRecords | None = None) -> int:
    """Delete journal entries written before `older_than` (epoch seconds), of `listing`
    (a listing of ``gc/`` taken before) or of a new listing."""
    old = []
    for info in catalog.store.list(layout.GC) if listing is None else listing:
        at = _journal_time(info.key)
        if at is not None and at < older_than:
            old.append(info.key)
    catalog.store.delete(old)
    if known is not None:
        for key in old:
            known.journal.pop(key, None)
    return len(old)


def _check_args(max_count: int | None, max_age_s: float | None) -> None:
    if (max_count is not None
            and (isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1)):
        raise ConfigError(
            f"savepoint history max_count={max_count!r} is invalid; expected an "
            "integer >= 1 or None (no limit)"
        )
    if max_age_s is not None and (
        isinstance(max_age_s, bool)
        or not isinstance(max_age_s, (int, float))
        or not math.isfinite(max_age_s)
        or max_age_s <= 0
    ):
        raise ConfigError(
            f"savepoint history max_age_s={max_age_s!r} is invalid; expected a number of "
            "seconds > 0 or None (no limit)"
        )


#: why savepoint retention keeps the savepoint the newest lineage started from
WHY_ORIGIN = "the job's newest lineage starts from it: restore=latest may restart there"


def relied_on_savepoints(catalog: Catalog, savepoints: Iterable[SnapshotEntry]) -> dict[str, str]:
    """The keys of `savepoints` (a listing of this job's savepoints taken before this
    call) that the job relies on, each with why; retention never disposes of them:

    * the one the newest lineage started from (`WHY_ORIGIN`): with no completed
      checkpoint of its own yet, ``restore=latest`` restarts there; after that it is the
      lineage's documented origin (and a rollback target);
    * blue's final savepoint of a zero-downtime cutover while a rollback of green's
      generation could return there (`cutover_lineage.cutover_savepoints`).

    :raises CutoverError: a cutover's plan is unreadable (nothing is judged).
    """
    listed = list(savepoints)
    kept = cutover_savepoints(catalog, listed)  # the cutovers first, then the origins: see there
    origins = catalog.origin_store.read()
    newest = max(origins, key=lambda o: o.generation) if origins else None
    if newest is not None and newest.kind == "savepoint" and newest.uri:
        try:
            kept.setdefault(catalog.snapshot_store.key_of(newest.uri), WHY_ORIGIN)
        except (RestoreError, InvalidPath):  # another job's savepoint (allowForeignJob): not ours to dispose
            pass
    return kept


def savepoint_history_retention(
    catalog: Catalog,
    *,
    max_count: int | None,
    max_age_s: float | None,
    now: float | None = None,
) -> list[str]:
    """Dispose of savepoints beyond the `max_count` newest or older than `max_age_s`;
    return the URIs disposed of, newest first.

    The newest valid savepoint is always kept, and so are the ones the job relies on
    (`relied_on_savepoints`: the one the newest lineage started from; blue's final
    savepoint of a cutover while a rollback of green's generation returns there).
    Incomplete savepoint directories (no ``_metadata``) untouched for more than an hour
    are removed too. A savepoint whose ``_metadata`` exists but does not validate is left
    alone and reported in a warning: it may be evidence, and `sparkpoint dispose` removes it on purpose.

    :raises ConfigError: `max_count` or `max_age_s` is not a positive number (or None).
    :raises CutoverError: a cutover's plan is unreadable; nothing was disposed.
    """
    _check_args(max_count, max_age_s)
    now = time.time() if now is None else now
    snapshots = catalog.snapshot_store
    entries = snapshots.list_savepoints()
    valid = sorted((e for e in entries if e.metadata is not None),
                   key=lambda e: (e.metadata.created_at if e.metadata else 0.0, e.id), reverse=True)
    disposed: list[str] = []
    relied_on = relied_on_savepoints(catalog, valid)  # after the listing: see there
    for index, entry in enumerate(valid):
        assert entry.metadata is not None
        if index == 0 or entry.key in relied_on:
            continue  # always keep the newest valid savepoint, and those the job relies on
        age = now - entry.metadata.created_at
        reason = None
        if max_count is not None and index >= max_count:
            reason = f"beyond the {max_count} newest"
        elif max_age_s is not None and age > max_age_s:
            reason = f"{age:.0f} s old, max age {max_age_s:g} s"
        if reason:
            snapshots.dispose(entry.key)
            log.info("disposed savepoint %s (%s)", entry.uri, reason)
            disposed.append(entry.uri)
    for entry in entries:
        if entry.metadata is not None:
            continue
        if entry.error and "no _metadata" in entry.error:
            newest = max((info.mtime for info in catalog.store.list(entry.key)), default=None)
            if newest is not None and now - newest > INCOMPLETE_GRACE_S:
                snapshots.dispose(entry.key)
                log.info("removed incomplete savepoint %s (untouched for %.0f s)", entry.uri, now - newest)
                disposed.append(entry.uri)
        else:
            log.warning("keeping invalid savepoint %s for inspection: %s (remove it "
                        "with `sparkpoint dispose`)",
                        entry.uri, entry.error)
    return disposed
