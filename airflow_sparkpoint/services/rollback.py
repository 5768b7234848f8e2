"""Abort a generation's output: the one home of this use case (the blue-green rollback,
the write-audit-publish discard), for `sparkpoint commit --abort-generation` and
`SparkpointCommitOperator(abort_generation=...)`.

Every uncommitted transaction the generation staged (confirmed by its checkpoints or
not) is aborted and its record deleted, so its output never becomes visible, and the
lineage returns to before its first aborted batch, so that no later restore continues
from state past output that is gone (docs/PROTOCOL.md, "The rollback"):

* the generation *g* is the newest one: the rollback first claims *g+1*, which fences *g*
  (a stalled driver of *g* fails at its next checkpoint or commit: its heartbeat's age
  proves nothing), and writes as *g+1*'s origin the newest checkpoint of *g* before its
  first aborted batch (where *g*'s committed output ends), else the point *g* started
  from: *g*'s later checkpoints are superseded and ``restore=latest`` restarts there;
* a newer generation exists: the rollback acts as the newest generation it read first
  (a start claimed meanwhile fences it), is refused while a checkpoint of *g* is still
  restorable or a newer generation started from a point that continues *g*'s lineage (a
  newer run continues it: roll that one back), and otherwise only aborts its leftovers.

`abort_stopped_generation` also refuses while *g*'s heartbeat is fresh. Pure Python: no
Spark, no Airflow.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.history import live_status
from airflow_sparkpoint.checkpoints.lineage import Origin, new_origin, rollback_base
from airflow_sparkpoint.checkpoints.snapshot_open import open_restart_snapshot, restored_by
from airflow_sparkpoint.exceptions import (
    ConfigError,
    CorruptMetadata,
    GenerationRunning,
    InvalidPath,
    RestoreError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.services.commit import Sinks, open_moved
from airflow_sparkpoint.services.cutover import cutover_of_lineage, note_rollback
from airflow_sparkpoint.sinks.resolve import SinkSpec
from airflow_sparkpoint.sinks.transactions import Settlement, settle_all

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import GenerationInfo
    from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord

log = logging.getLogger(__name__)

__all__ = ["abort_generation", "abort_stopped_generation"]


def abort_stopped_generation(
    catalog: Catalog,
    generation: int,
    *,
    max_heartbeat_age: float,
    how_to_stop: str,
    storage_options: Mapping[str, Any] | None = None,
    sink: SinkSpec | None = None,
) -> list[str]:
    """Abort every uncommitted transaction `generation` of `catalog`'s job staged (see
    `abort_generation`); return the aborted transaction ids.

    :param max_heartbeat_age: a run with a younger heartbeat is still live.
    :param how_to_stop: how the caller's user stops the run (named in the refusal).
    :param sink: the job's declared sink (see `services.commit.commit_pending`).
    :raises GenerationRunning: `generation` is still live; nothing was aborted.
    :raises SinkError: an abort failed (see `abort_generation`).
    """
    live = live_status(catalog, max_heartbeat_age)
    if live is not None and live.generation == generation:
        raise GenerationRunning(
            f"generation {generation} of job {catalog.job!r} is still running (heartbeat younger than "
            f"{max_heartbeat_age:g} s); stop it first ({how_to_stop}) before aborting its output"
        )
    return abort_generation(catalog, generation, storage_options=storage_options, sink=sink)


def abort_generation(
    catalog: Catalog, generation: int, storage_options: Mapping[str, Any] | None = None,
    sink: SinkSpec | None = None,
) -> list[str]:
    """Abort every uncommitted transaction of `generation` and delete its record (see the
    module docstring), through the one settling rule (`sinks.transactions.settle_all`):
    a transaction that holds its batch's commit is finished instead (never aborted), the
    commit head moved, its record deleted too, and reported in the log. Returns the
    aborted transaction ids. `sink` is the job's sink, as for
    `services.commit.commit_pending`.

    :raises ConfigError: `generation` was never claimed.
    :raises RestoreError: a newer generation continues `generation`'s lineage.
    :raises StaleGeneration: a newer generation was claimed while the rollback ran (a
        restore that reads what the rollback was changing); nothing more is touched, and
        running it again is safe.
    """
    sinks = Sinks(storage_options, sink, catalog.job)
    fence = _fence(catalog, generation, sinks)

    def note(settlement: Settlement, done: int, total: int) -> None:
        if settlement.outcome != "aborted":  # visible (a promotion the abort had to finish)
            log.warning("transaction %s of generation %d has already committed to %s; not aborted",
                        settlement.record.txn_id, generation, settlement.record.sink_id)
        faults.maybe_kill_halfway("abort", settlement.record.batch_id, done, total)

    # The one settling rule (`settle_all`): a finished transaction moves the commit head
    # and its record goes; an abort decided past a newer claim keeps its record.
    mine = [record for record in catalog.transactions() if record.generation == generation]
    settled = settle_all(catalog, mine, sinks.of, confirmed=False, fence=fence, on_settled=note)
    aborted = [s.record.txn_id for s in settled if s.outcome == "aborted"]
    log.info("aborted %d transaction(s) of generation %d of job %s: %s",
             len(aborted), generation, catalog.job, aborted)
    try:
        returned = next((o for o in catalog.origins() if o.generation == fence.generation
                         and o.restore.get("rollback_of") == generation), None)
        rolled = note_rollback(catalog, generation, by=f"rollback of generation {generation}",
                               reason=f"generation {generation} rolled back: {len(aborted)} transaction(s) "
                                      "aborted",
                               restore=returned.uri if returned is not None else None)
    except SparkpointError as exc:  # the rollback is done; its mark in the cutover is not: say so
        log.warning("rollback of generation %d of job %s: its cutover could not be marked rolled back: %s",
                    generation, catalog.job, exc)
        rolled = None
    if rolled is not None:
        log.warning("generation %d was the green of cutover %s: the cutover is marked rolled back, the job "
                    "returns to %s (what green committed before the rollback stays visible)", generation,
                    rolled.id, rolled.restore or "where green's lineage says")
    return aborted


def _fence(catalog: Catalog, generation: int, sinks: Sinks) -> Fence:
    """The fence the rollback of `generation` acts as, after fencing `generation` and
    moving the lineage back when it is the newest (see the module docstring).

    :raises ConfigError: `generation` was never claimed.
    :raises RestoreError: a newer generation continues `generation`'s lineage, or the newest
        one has no origin yet (it may); `generation`'s return point is gone or behind its
        committed output (`_restart_before`). Nothing was aborted.
    """
    current = catalog.current_generation()
    if not 1 <= generation <= current:
        raise ConfigError(f"generation {generation} of job {catalog.job!r} was never claimed (the newest is "
                          f"{current}); see `sparkpoint history`")
    if generation < current:
        earlier = _earlier_tries(catalog, generation, current)
        if earlier is not None:
            # A retry of this rollback: every newer generation is a try's claim, which no
            # run continues even when its origin is one of `generation`'s checkpoints.
            if any(o.generation == earlier.generation for o in catalog.origins()):
                return Fence(catalog, earlier.generation)  # its origin is written: aborts are left
            # That try may still be writing its pin and origin (or died first): fence it.
            claim = catalog.claim_generation_after(current, {"rollback_of": generation,
                                                             "plan": f"rollback of generation {generation}"})
            if claim is None:
                return _fence(catalog, generation, sinks)
            return _return_lineage(catalog, generation, claim, sinks)
        # The rollback acts as the newest generation it read, before reading the lineages it
        # judges: a start claimed during its checks fences it (found by a review: a fence
        # observed after the checks admitted a start whose restart point they never read).
        fence = Fence(catalog, current)
        # A newer run continues the lineage when a restorable checkpoint, or the point a
        # newer generation's origin restored (superseded or not: retries restart there), is
        # the generation's own or confirms one of its transactions.
        entries = catalog.list_checkpoints()
        origins = catalog.origins()  # after the checkpoints: every origin they were judged by, or more
        if origins and not any(o.generation == current for o in origins):  # none: an earlier release's store
            raise RestoreError(
                f"generation {generation} of job {catalog.job!r} is not the newest ({current}), and "
                f"generation {current} is starting (no lineage origin yet): it may restore generation "
                f"{generation}'s checkpoint. Nothing was aborted; run the rollback again once it has started "
                "or failed"
            )
        continued = [meta for meta in (e.metadata for e in entries if e.restorable)
                     if meta is not None and _continues(meta, catalog.job, generation)]
        started = _continued_start(catalog, generation, origins)
        if started is not None:
            raise RestoreError(
                f"generation {generation} of job {catalog.job!r} is not the newest ({current}) and the "
                f"snapshot {started} restores its lineage: a newer run continues it. Roll back the newest "
                "generation instead (see `sparkpoint history`); nothing was aborted"
            )
        if continued:
            raise RestoreError(
                f"generation {generation} of job {catalog.job!r} is not the newest "
                f"({current}) and checkpoint "
                f"{catalog.checkpoint_uri(continued[0].id)} (generation "
                f"{continued[0].generation}) still restores "
                "its lineage: a "
                "newer run continues it. Roll back the newest generation instead (see "
                "`sparkpoint history`); nothing "
                "was aborted"
            )
        return fence
    # Exactly the next one: a start that claimed it since the read above may continue
    # `generation`'s lineage, so the rollback decides again as for a superseded generation.
    claim = catalog.claim_generation_after(generation, {"rollback_of": generation,
                                                        "plan": f"rollback of generation {generation}"})
    if claim is None:
        return _fence(catalog, generation, sinks)
    return _return_lineage(catalog, generation, claim, sinks)


def _continues(meta: SnapshotMetadata, job: str, generation: int) -> bool:
    """Whether snapshot `meta` stands on `generation`'s lineage: it is `job`'s and
    `generation`'s own, or confirms one of `generation`'s transactions."""
    return meta.job == job and (meta.generation == generation
                                or any(t.generation == generation for t in meta.transactions))


def _continued_start(catalog: Catalog, generation: int, origins: list[Origin]) -> str | None:
    """The start point of a newer generation's origin that continues `generation`'s lineage
    (`_continues`), superseded or not (a retry of that lineage restarts there), or a start
    point outside the root that cannot be read (another storage service, gone, unreadable,
    replaced by another snapshot: it may); None otherwise. A start point in the root is
    judged by its ``_metadata``, else its pin's (`_start_metadata`); gone with its pin, no
    restart stands there; there but unreadable (a store error, a damaged record), it may.
    Found by a review: a savepoint outlives the checkpoint it was taken from, so the
    origins' bases alone miss the lineages it starts."""
    for origin in origins:
        if origin.generation <= generation or origin.uri is None:
            continue
        meta: SnapshotMetadata | None
        if catalog.snapshot_store.in_root(origin.uri):
            try:
                meta = _start_metadata(catalog, origin.uri, origin)
            except (StorageError, CorruptMetadata, InvalidPath) as exc:
                return f"{origin.uri} ({exc}; it may)"
            if meta is None:
                continue
        else:
            try:
                meta = open_moved(catalog, origin.uri)
            except RestoreError as exc:
                return f"{origin.uri} ({exc}; it may)"
            if meta is None:
                return f"{origin.uri} (on another storage service: it may)"
            if origin.snapshot_id is not None and not restored_by(meta, origin):
                return f"{origin.uri} (holds another snapshot than the one restored: replaced since; it may)"
        if _continues(meta, catalog.job, generation):
            return origin.uri
    return None


def _start_metadata(catalog: Catalog, uri: str, origin: Origin) -> SnapshotMetadata | None:
    """What `origin`'s start point `uri` in the root confirms: its ``_metadata``, else its pin's,
    as a restart chooses (`open_restart_snapshot`), read without listing the snapshot's
    files (a rollback reads one per newer origin: `SnapshotStore.read_in_root`). None when
    neither is there any more (deleted: no restart stands there).

    :raises StorageError, CorruptMetadata, InvalidPath: one is there but cannot be read
        (found by a review: a read error taken for a deletion let a rollback abort what
        the start point confirms).
    """
    try:
        return open_restart_snapshot(uri, origin, catalog.snapshot_store.read_in_root).metadata
    except RestoreError:
        return None


def _earlier_tries(catalog: Catalog, generation: int, current: int) -> GenerationInfo | None:
    """The newest claim when every generation after `generation` through `current` is a
    claim of a rollback of `generation` (``rollback_of``), else None."""
    claim = None
    for newer in range(generation + 1, current + 1):
        claim = catalog.generation_claim(newer)
        if claim is None or claim.details.get("rollback_of") != generation:
            return None
    return claim


def _return_lineage(catalog: Catalog, generation: int, claim: GenerationInfo, sinks: Sinks) -> Fence:
    """The fence of the rollback's new claim `claim`, after writing its origin (where the
    lineage of `generation` returns to).

    :raises RestoreError: see `_restart_before`. Nothing was aborted.
    """
    fence = Fence(catalog, claim.generation)
    mine = [r for r in catalog.transactions() if r.generation == generation]  # after the fence: final
    back = _blue_savepoint_origin(catalog, generation, claim.generation, mine, sinks)
    if back is not None:
        catalog.write_origin(back)
        log.warning("rollback of generation %d of job %s (a cutover's green): claimed generation %d to "
                    "fence it; the job restarts from %s", generation, catalog.job, claim.generation,
                    back.describe())
        return fence
    uncommitted = [r.batch_id for r in mine if not _promoted(sinks, r)]
    if not uncommitted:
        log.warning("rollback of generation %d of job %s: claimed generation %d to "
                    "fence it; nothing of it is "
                    "left to abort", generation, catalog.job, claim.generation)
        return fence
    committed = max((p for p in (sinks.of(r).committed_position(catalog.job)
                                 for r in {r.sink_id: r for r in mine}.values()) if p is not None),
                    default=None)
    origin = _restart_before(catalog, generation, min(uncommitted), claim.generation, committed)
    if origin is None:  # a store of a release before lineages: no origin to return to
        _retire_checkpoints(catalog, generation, fence)
    else:
        catalog.write_origin(origin)
    log.warning("rollback of generation %d of job %s: claimed generation %d to fence it; "
                "the job restarts from %s",
                generation, catalog.job, claim.generation,
                origin.describe() if origin is not None else "where the generation before it left off")
    return fence


def _promoted(sinks: Sinks, record: TransactionRecord) -> bool:
    """Whether `record`'s batch is committed or will be: its promotion is decided, and a
    decided promotion stands (an abort finishes it); the sink's position may not show it
    yet (found at 20269802:2210)."""
    return sinks.of(record).decision(record) == "promote"


def _blue_savepoint_origin(catalog: Catalog, generation: int, claimed: int, mine: list[TransactionRecord],
                           sinks: Sinks) -> Origin | None:
    """The origin of `claimed` that returns the job to blue's final savepoint S of batch N
    when `generation` runs a cutover's green's lineage (`services.cutover.cutover_of_lineage`)
    and its sinks hold nothing of green's past N (read from the sink, through green's
    records or S's pending transactions): blue's state at N, exactly where its output
    ends. None otherwise (no such cutover, no savepoint, S gone, green committed past N:
    then the rollback returns to green's own checkpoint before its first aborted batch,
    exact too; a restore of S by path with ``restore.sinkAhead=rewind`` on a Delta sink
    removes green's output). A savepoint origin supersedes every checkpoint before it
    (base -1); savepoint retention keeps the newest lineage's origin.
    """
    try:
        state = cutover_of_lineage(catalog, generation)
    except SparkpointError as exc:
        log.warning("rollback of generation %d of job %s: its cutover is unreadable (%s); returning to its "
                    "own checkpoint", generation, catalog.job, exc)
        return None
    claim = state.taken if state is not None else None
    if state is None or claim is None or claim.savepoint is None:
        return None
    savepoint, n = claim.savepoint, claim.batch_id
    try:
        handle = catalog.own_snapshot(savepoint)
    except SparkpointError as exc:
        handle, why = None, str(exc)
    else:
        why = "not a savepoint of this job's root"
    if handle is None or handle.metadata.kind != "savepoint" or handle.metadata.batch_id != n:
        log.warning("rollback of generation %d of job %s: blue's final savepoint %s of batch %d is not "
                    "usable (%s); returning to green's own checkpoint", generation, catalog.job, savepoint, n,
                    why)
        return None
    records = [*mine, *handle.metadata.transactions]
    positions = {sinks.of(r).sink_id: sinks.of(r).committed_position(catalog.job) for r in records}
    if not positions:
        log.warning("rollback of generation %d of job %s: no record names its sink, so whether green "
                    "committed past batch %d cannot be read; returning to green's own checkpoint", generation,
                    catalog.job, n)
        return None
    committed = max([*(p for p in positions.values() if p is not None),
                     *(r.batch_id for r in records if _promoted(sinks, r))], default=None)
    if committed is not None and committed > n:
        log.warning("rollback of generation %d of job %s: green committed through batch %d, past the "
                    "cutover's batch %d: returning to green's own checkpoint (blue's final savepoint %s "
                    "stays; restore it by path with restore.sinkAhead=rewind on a Delta sink to remove "
                    "green's output)",
                    generation, catalog.job, committed, n, savepoint)
        return None
    own = next((o for o in catalog.origins() if o.generation == generation), None)
    restore = {"restore": savepoint, "sink_ahead": "fail", "force": False, "allow_foreign_job": False,
               "rollback_of": generation, "cutover": state.id}
    if own is not None:
        restore = {**own.restore, **restore}
    return new_origin(claimed, kind="savepoint", uri=savepoint, base_id=-1, snapshot_id=handle.metadata.id,
                      batch_id=n, id_floor=catalog.next_checkpoint_id() - 1, restore=restore, live_dir=None,
                      host=socket.gethostname(), pid=os.getpid())


def _restart_before(catalog: Catalog, generation: int, first_aborted: int, claimed: int,
                    committed: int | None) -> Origin | None:
    """The origin of `claimed` that returns the lineage of `generation` to before its batch
    `first_aborted`: its newest restorable checkpoint before that batch, else the point it
    started from; owned by `claimed` like a restore by path (a copy in its pin), unless
    that point is already a pin, empty state, or another root's. None when `generation`
    recorded no origin (a store of an earlier release). `committed`: the newest batch the
    generation's sinks have committed.

    :raises RestoreError: that point is gone (its base checkpoint was removed once the
        generation had checkpoints of its own), or it is behind batch `committed` (every
        restart from it would find the sink ahead); nothing was aborted.
    """
    own = next((o for o in catalog.origins() if o.generation == generation), None)
    if own is None:
        return None
    restore = {**own.restore, "rollback_of": generation}
    host, pid = socket.gethostname(), os.getpid()
    point = rollback_base(catalog.list_checkpoints(), generation, first_aborted)
    after = point.metadata.batch_id if point is not None and point.metadata is not None else own.batch_id
    if committed is not None and committed > (-1 if after is None else after):
        where = f"batch {after}" if after is not None else "empty state"
        raise RestoreError(
            f"cannot roll back generation {generation} of job {catalog.job!r}: its sink "
            "has committed up to batch "
            f"{committed}, and the newest point it can return to is {where} (no "
            "restorable checkpoint of it at a "
            "committed batch is left: retention may have removed them before the commit "
            "step ran); a restart there "
            "would find the sink ahead. Nothing was aborted: restore=latest resumes the generation and the "
            "commit step publishes what its checkpoints confirm"
        )
    if point is not None and point.metadata is not None:
        base = point.metadata
        pin = catalog.create_savepoint(catalog.handle(base), key=layout.pin_dir(claimed))
        return new_origin(claimed, kind="checkpoint", uri=catalog.checkpoint_uri(base.id), base_id=base.id,
                          snapshot_id=base.id, batch_id=base.batch_id,
                          id_floor=catalog.next_checkpoint_id() - 1,
                          restore=restore, pin=pin.uri, live_dir=None, host=host, pid=pid,
                          base_generation=base.generation)
    # The same start point, a new lineage: checkpoints in use now are not its own.
    origin = replace(own, generation=claimed, created_at=time.time(), restore=restore, live_dir=None,
                     host=host, pid=pid, id_floor=catalog.next_checkpoint_id() - 1)
    if own.uri is None or own.pin is not None:
        return origin
    try:
        handle = catalog.own_snapshot(own.uri)
    except RestoreError as exc:
        raise RestoreError(
            f"cannot roll back generation {generation} of job {catalog.job!r}: it has "
            "no checkpoint before its "
            f"first uncommitted batch {first_aborted}, and {own.describe()}, where it "
            f"started, is gone ({exc}); "
            "nothing was aborted. Restore an earlier savepoint or checkpoint by path "
            "instead: its recovery aborts "
            "what that point does not confirm"
        ) from exc
    if handle is None:
        return origin  # another root's snapshot: no retention of this job deletes it
    pin = catalog.create_savepoint(handle, key=layout.pin_dir(claimed))
    return replace(origin, pin=pin.uri)


def _retire_checkpoints(catalog: Catalog, generation: int, fence: Fence) -> None:
    """Without lineages (a store of an earlier release), a rolled-back generation's
    checkpoints hold state whose output is gone: their ``_metadata`` goes, so that no
    restore picks them; retention collects their files."""
    for meta in catalog.checkpoints():
        if meta.generation == generation:
            fence.check()
            catalog.dispose(catalog.checkpoint_uri(meta.id))
            log.warning("retired checkpoint %d (batch %d) of rolled-back generation %d of job %s",
                        meta.id, meta.batch_id, generation, catalog.job)
