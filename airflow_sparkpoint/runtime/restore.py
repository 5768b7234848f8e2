"""Choosing and preparing the restart point of a run (``spark.sparkpoint.restore``).

``latest``  the lineage rule of `Catalog.restart_point`: the newest restorable checkpoint
            of the newest lineage, else the snapshot (or empty state) that lineage started
            from; complete checkpoints that are all damaged fail with the way out;
``none``    empty state (refused when the job already has checkpoints, unless forced);
a path      a savepoint or retained checkpoint.

`plan_restore` only reads: the runtime calls it once before claiming its generation (so
bad input fails before anything is written, invariant 7) and again after the claim (that
plan is authoritative, invariant 8). Every sink is asked for its committed position
(invariant 4): restoring a snapshot the sink has already moved past is refused unless the
policy rewinds it. The live location is resumed in place only when its previous owner is
proven gone (`airflow_sparkpoint.runtime.livedir`); otherwise the run materializes a fresh
one, hard-linking what it can from the previous location.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle, SnapshotMetadata, layout, open_snapshot
from airflow_sparkpoint.checkpoints.lineage import Origin
from airflow_sparkpoint.checkpoints.snapshot_open import open_restart_snapshot
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.exceptions import (
    InvalidPath,
    ObjectNotFound,
    RestoreError,
    SinkAheadError,
    SinkLineageError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.runtime import livedir, replay, rescale
from airflow_sparkpoint.runtime.config import PREFIX, SparkpointConfig
from airflow_sparkpoint.runtime.materialize import materialize
from airflow_sparkpoint.runtime.prestore import IndexEntry
from airflow_sparkpoint.runtime.restore_plan import RestorePlan, under_root
from airflow_sparkpoint.runtime.sink_lineage import divergence
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.storage.paths import confine

__all__ = ["LiveChoice", "LiveReuse", "RestorePlan", "check_sink_position", "choose_live", "fill_live",
           "materialize", "pin_restart_point", "plan_restore", "seed_index_in_place"]

log = logging.getLogger(__name__)

def plan_restore(cfg: SparkpointConfig, catalog: Catalog, previous_live: str | None = None) -> RestorePlan:
    """Decide the restart point without changing anything. (`previous_live` is accepted
    for compatibility; the live location is chosen after the claim, by `choose_live`.)

    :raises RestoreError: a missing, corrupt or foreign restore target, ``none`` on a job
        that has checkpoints (without ``restore.force``), or checkpoints that are all damaged.
    """
    if cfg.restore == "none":
        latest = catalog.latest()
        if latest is not None and not cfg.restore_force:
            raise RestoreError(
                f"spark.sparkpoint.restore=none but job {cfg.job!r} has completed checkpoints "
                f"(latest: {catalog.checkpoint_uri(latest.id)}); set "
                "spark.sparkpoint.restore.force=true to start "
                "with empty state anyway, or use restore=latest"
            )
        return RestorePlan(None, "empty state (restore=none)", sink_ahead=cfg.restore_sink_ahead)
    if cfg.restore == "latest":
        point = catalog.restart_point()
        origin = point.origin
        policy = cfg.restore_sink_ahead
        if origin is not None and origin.restore.get("sink_ahead") == "rewind":
            # The lineage being continued was started with a rewind to this very snapshot
            # (its run may have died before or during the rewind): finish what it asked.
            policy = "rewind"
        if point.checkpoint is not None:
            handle = catalog.handle(point.checkpoint)
            return RestorePlan(handle, point.description, "checkpoint", point.checkpoint.id, True, policy,
                               origin, latest=True, code_version=cfg.code_version)
        if point.uri is not None:
            assert origin is not None
            handle = open_restart_snapshot(
                point.uri, origin, lambda uri: open_snapshot(uri, storage_options=cfg.storage_options))
            allow = cfg.restore_allow_foreign_job or bool(origin.restore.get("allow_foreign_job"))
            return replace(_plan_for(handle, catalog, cfg.job, allow, policy, point.description, origin),
                           latest=True, code_version=cfg.code_version)
        return RestorePlan(None, point.description, sink_ahead=policy, continues=origin, latest=True,
                           code_version=cfg.code_version)
    handle = open_snapshot(cfg.restore, storage_options=cfg.storage_options)
    meta = handle.metadata
    return _plan_for(handle, catalog, cfg.job, cfg.restore_allow_foreign_job, cfg.restore_sink_ahead,
                     f"{meta.kind} {handle.uri} (batch {meta.batch_id})", None)


def pin_restart_point(plan: RestorePlan, catalog: Catalog, generation: int) -> str | None:
    """Own the restart point before relying on it, after the claim and before the origin
    is written (see `airflow_sparkpoint.checkpoints.lineage`): a snapshot of this job in
    its own root restored by path (a checkpoint a stale retention pass may delete, a
    savepoint savepoint retention may dispose of before the lineage's first checkpoint),
    and an earlier generation's pin that ``restore=latest`` restarts from (pruned with
    its origin), are copied to this generation's pin. Returns the pin's URI, or None when
    nothing needs one (``restore=latest`` of a checkpoint, which a stale retention pass
    never deletes, or of a savepoint the newest lineage relies on, which retention keeps;
    empty state; another job's or another root's snapshot, which no retention of this
    job touches).

    :raises SparkpointError: the snapshot could not be copied (say, a retention pass
        deleted it meanwhile); nothing else was written (a partial copy is removed).
    """
    snapshot = plan.snapshot
    if snapshot is None or snapshot.metadata.job != catalog.job or not under_root(snapshot.uri, catalog.uri):
        return None
    pinned = plan.continues is not None and plan.continues.pin is not None and (
        snapshot.uri.rstrip("/") == plan.continues.pin.rstrip("/"))
    if plan.latest and not pinned:
        return None
    key = layout.pin_dir(generation)
    try:
        pin = catalog.create_savepoint(snapshot, key=key)
    except (StorageError, ObjectNotFound) as exc:
        try:
            catalog.store.delete_prefix(key)
        except StorageError:
            pass  # an unfinished pin without _metadata is never read; its origin never names it
        raise RestoreError(
            f"could not copy the restore target {snapshot.uri} for generation {generation}: {exc}; it may "
            "have been deleted meanwhile (see `sparkpoint list`)"
        ) from exc
    log.info("generation %d owns a copy of its restart point %s: %s", generation, snapshot.uri, pin.uri)
    return pin.uri


def _plan_for(handle: SnapshotHandle, catalog: Catalog, job: str, allow_foreign: bool, policy: str,
              description: str, origin: Origin | None) -> RestorePlan:
    meta = handle.metadata
    if meta.job != job and not allow_foreign:
        raise RestoreError(
            f"restore target {handle.uri} belongs to job {meta.job!r}, not {job!r}; set "
            "spark.sparkpoint.restore.allowForeignJob=true to restore it into this job"
        )
    # A snapshot of this job under this job's root continues its checkpoint ids; anything
    # else (another job, a moved savepoint) starts a lineage that supersedes every older one.
    ours = meta.job == job and under_root(handle.uri, catalog.uri)
    base = -1
    if ours and meta.kind == "checkpoint":
        base = meta.id
    elif ours and meta.source_checkpoint is not None:
        base = meta.source_checkpoint
    own_files = handle.files_store.uri.rstrip("/") == catalog.store.uri.rstrip("/")
    return RestorePlan(handle, description, meta.kind, base, own_files, policy, origin)


def _live_matches(live: str, latest: SnapshotMetadata) -> bool:
    """The live location is exactly at `latest` and of the same query lineage: the one
    `latest` was taken from (two lineages forked from one checkpoint reach the same batch
    with the same query metadata in different locations), at its batch."""
    path = livedir.local_path_of(live)
    if path is None or not os.path.isdir(path):
        return False
    source = livedir.local_path_of(latest.live_root) if latest.live_root else None
    if source is None or os.path.realpath(source) != os.path.realpath(path):
        return False
    if livedir.last_commit(path) != latest.batch_id or rescale.interrupted(path, latest.batch_id):
        return False
    meta_ref = next((f for f in latest.files if f.path == "metadata"), None)
    try:
        return meta_ref is not None and livedir.file_sha256(os.path.join(path, "metadata")) == meta_ref.sha256
    except (FileNotFoundError, InvalidPath):  # a link or a FIFO planted as the metadata: not resumed
        return False


def check_sink_position(
    plan: RestorePlan,
    sink: Sink,
    job: str,
    policy: str | None = None,
    *,
    apply: bool = True,
    fence: Callable[[], None] | None = None,
    catalog: Catalog | None = None,
) -> bool:
    """Invariants 4 and 12: refuse (or, with ``restore.sinkAhead=rewind``, rewind the sink)
    when the sink has committed batches of `job` beyond the restart point, or does not
    hold exactly what the restart point's lineage committed (`runtime.sink_lineage`, when
    `catalog` is given). Returns whether the sink is (with `apply`: was) rewound. Without
    `apply` nothing is changed (the checks before and right after the claim, before the
    origin is written); `fence` is called right before a rewind.

    With ``restore=latest`` and the ``fail`` policy, a sink ahead is no error when the
    batches it holds past the restart point can be replayed exactly (`replay.plan_replay`;
    the run replays them after the claim, `replay.replay_committed`); the refusal says
    why they cannot.

    :raises SinkLineageError: the sink holds another lineage's output, lost the
        lineage's, or a confirmed transaction was aborted since; not fixable by the policy.
    :raises SinkAheadError: the sink is ahead and the policy is ``fail`` (or rewinding is refused).
    """
    policy = policy or plan.sink_ahead
    restart = plan.batch_id
    where = f"batch {restart} of {plan.snapshot.uri}" if plan.snapshot else "empty state"
    if catalog is not None and plan.snapshot is not None:
        found = divergence(plan.snapshot, sink, catalog, job,
                           own_root=under_root(plan.snapshot.uri, catalog.uri))
        if found is not None:
            if found.rewindable and policy == "rewind" and sink.can_rewind:
                return _rewind(plan, sink, job, where, found.describe(sink, plan.snapshot.uri), apply, fence,
                               error=SinkLineageError)
            raise SinkLineageError(
                f"{found.describe(sink, plan.snapshot.uri)}; restoring {where} would lose or mix output. "
                + ("Nothing was changed. Restore a snapshot of the lineage the sink holds "
                   "(see `sparkpoint list` and "
                   "`sparkpoint history`)"
                   + (f", or set {PREFIX}restore.sinkAhead=rewind to rewind the sink to "
                      "that lineage's own commit"
                      if found.rewindable and sink.can_rewind else "")
                   + (f" ({type(sink).__name__} cannot rewind)"
                      if found.rewindable and not sink.can_rewind else ""))
            )
    position = sink.committed_position(job)
    if not apply and catalog is not None:
        position = _decided_position(plan, sink, catalog, job, position)
    if position is None or (restart is not None and position <= restart):
        return False
    because = ""
    if plan.replays_ahead(sink, policy):
        found_replay = replay.plan_replay(plan.snapshot, sink, job, position, plan.code_version)
        if not isinstance(found_replay, str):
            return False
        because = f" The committed batches cannot be replayed from the restart point: {found_replay}."
    if policy == "rewind" and plan.snapshot is not None and sink.can_rewind:
        return _rewind(plan, sink, job, where, f"sink {sink.sink_id} is at batch {position}, past {where}",
                       apply, fence)
    newer = f"Restore a checkpoint or savepoint at or after batch {position} (see `sparkpoint list`)"
    if not sink.can_rewind:
        # S3Sink, DirectorySink: committed objects cannot be taken back, whatever the policy.
        remedy = (f"{newer}, or write to a new output location. {type(sink).__name__} cannot rewind: "
                  "committed output cannot be taken back (restore.sinkAhead=rewind "
                  "works with DeltaSink only)")
    elif plan.snapshot is None:
        remedy = f"{newer}; a rewind needs a snapshot to rewind to, and this restore starts from empty state"
    else:
        remedy = f"{newer}, or set {PREFIX}restore.sinkAhead=rewind to rewind the sink to the snapshot"
    raise SinkAheadError(
        f"sink {sink.sink_id} has already committed batch {position} of job {job!r}, past the restore point "
        f"({where}); restoring would duplicate or lose output.{because} {remedy}"
    )


def _decided_position(plan: RestorePlan, sink: Sink, catalog: Catalog, job: str,
                      position: int | None) -> int | None:
    """The sink's position once the transactions recovery will finish have landed: a
    recorded transaction the restart point does not confirm whose committer decided to
    promote it (a run stalled in its commit) is finished by `settle_unconfirmed`, never
    aborted. The check before the origin counts it, so that its landing cannot refuse the
    start after the origin is written (the window left: a committer that decides after
    this read, see docs/PROTOCOL.md)."""
    confirmed = ({(t.batch_id, t.generation) for t in plan.snapshot.metadata.transactions}
                 if plan.snapshot else set())
    restart = -1 if plan.batch_id is None else plan.batch_id
    for record in catalog.transactions():
        if (record.job != job or record.batch_id <= restart
                or (record.batch_id, record.generation) in confirmed):
            continue
        if (position is None or record.batch_id > position) and sink.decision(record) == "promote":
            position = record.batch_id
    return position


def _rewind(plan: RestorePlan, sink: Sink, job: str, where: str, why: str, apply: bool,
            fence: Callable[[], None] | None, *, error: type[SinkAheadError] = SinkAheadError) -> bool:
    """Rewind `sink` to the restart point's lineage (``restore.sinkAhead=rewind``).

    :raises SinkAheadError: (`error`) the rewind cannot be done (`Sink.rewind_problem`),
        checked before anything is written.
    """
    assert plan.snapshot is not None
    problem = sink.rewind_problem(job, plan.snapshot.metadata)
    if problem is not None:
        raise error(f"{why}, and {problem}. Nothing was changed. Restore a snapshot of "
                    "the lineage the sink holds "
                    "(see `sparkpoint list`), or write to a new output location")
    if not apply:
        return True
    if fence is not None:
        fence()
    log.warning("%s: rewinding it to %s (restore.sinkAhead=rewind)", why, where)
    sink.rewind(job, plan.snapshot.metadata)
    faults.maybe_kill("rewind", plan.snapshot.metadata.batch_id)
    return True


# ---------------------------------------------------------------------------- the live location


@dataclass(frozen=True)
class LiveReuse:
    """How the run's live location came to be (part of the run result)."""

    mode: str  # "in-place" | "materialized" | "empty" | "adopted"
    live_dir: str
    linked: int = 0  # files hard-linked from the previous location
    downloaded: int = 0  # files downloaded from the snapshot
    reason: str = ""
    skipped: int = 0  # the snapshot's older state versions a restart does not read, not materialized

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LiveChoice:
    """The location a run will use, locked by it; `link_from` is a previous location whose
    unchanged files may be hard-linked instead of downloaded."""

    path: str
    lock: livedir.LiveLock
    in_place: bool
    link_from: str | None
    reason: str
    #: green's own location adopted at a cutover (`adopted_live`): used as it is
    adopted: bool = False


def choose_live(
    plan: RestorePlan,
    candidates: Sequence[str | None],
    status: JobStatus | None,
    *,
    work_root: str,
    job: str,
    generation: int,
    jvm_pid: int | None,
    allow_in_place: bool = True,
) -> LiveChoice:
    """Lock the location this generation will use: a previous one (`candidates`: the
    newest lineage's and the status record's) when the plan restores exactly its state,
    its owner is proven gone and `allow_in_place`; otherwise a fresh ``g<generation>``."""
    own = [(os.getpid(), livedir.process_start(os.getpid()))]
    if jvm_pid:
        own.append((jvm_pid, livedir.process_start(jvm_pid)))
    paths: list[str] = []
    for candidate in candidates:
        path = livedir.local_path_of(candidate) if candidate else None
        if path and os.path.isdir(path) and path not in paths:
            try:  # read from the lineage or status record: only a location of this job's work root
                confine(os.path.relpath(os.path.realpath(path), os.path.realpath(work_root)),
                        what=f"previous live location {candidate!r} (read from the "
                             f"store) relative to {work_root}")
            except InvalidPath as exc:
                log.warning("%s; not reused", exc)
                continue
            paths.append(path)
    fresh = os.path.join(work_root, f"g{generation}")
    paths = [p for p in paths if os.path.realpath(p) != os.path.realpath(fresh)]
    livedir.unlink_planted(fresh)
    reason = "no previous live location" if not paths else ""
    if plan.snapshot is not None and plan.own_checkpoint and not allow_in_place:
        reason = "a rescale works on a fresh copy"
    elif plan.snapshot is not None and plan.own_checkpoint:
        for path in paths:
            try:
                lock = livedir.try_lock(path)
            except OSError as exc:  # replaced by a link since it was confined
                reason = f"{path} is not usable ({exc})"
                continue
            if lock is None:
                reason = f"{path} is held by a running generation"
                continue
            assert lock.dir is not None
            gone, why = livedir.previous_owner_gone(path, livedir.read_owner(lock.dir), status, own=own)
            if gone and _live_matches(path, plan.snapshot.metadata):
                livedir.write_owner(lock.dir, livedir.owner_record(job, generation, jvm_pid))
                return LiveChoice(path, lock, True, None, f"resume in place: {why}")
            lock.release()
            reason = f"{path}: {why}" if not gone else f"{path} is not at batch {plan.batch_id}"
    elif plan.snapshot is None:
        reason = "empty state"
    lock = livedir.try_lock(fresh)
    if lock is None:
        raise SparkpointError(f"live location {fresh} of generation {generation} is "
                              "locked by another process")
    assert lock.dir is not None
    livedir.write_owner(lock.dir, livedir.owner_record(job, generation, jvm_pid))
    return LiveChoice(fresh, lock, False, paths[0] if paths else None, reason or "a fresh location")


def adopted_live(path: str, *, job: str, generation: int, jvm_pid: int | None) -> LiveChoice:
    """Lock green's own live location `path` (its shadow's, at the cutover's batch N) for
    generation `generation` of `job`, which adopted it (zero-downtime blue-green): its
    state is green's, not the restart point's, so it is used as it is (`fill_live`
    indexes nothing of it: the adoption checkpoint stores every file).

    :raises SparkpointError: another process holds it, or it is not usable.
    """
    try:
        lock = livedir.try_lock(path)
    except OSError as exc:
        raise SparkpointError(f"green's live location {path} is not usable ({exc})") from None
    if lock is None:
        raise SparkpointError(f"green's live location {path} is locked by another process (its shadow run?)")
    assert lock.dir is not None
    livedir.write_owner(lock.dir, livedir.owner_record(job, generation, jvm_pid))
    return LiveChoice(path, lock, True, None, "green's own state at the cutover's batch", adopted=True)


def fill_live(choice: LiveChoice, plan: RestorePlan, *,
              repair: bool = True) -> tuple[dict[str, IndexEntry], LiveReuse]:
    """Bring the chosen location to the restart point; return the coordinator's file index.
    `repair`: Spark falls back to an older snapshot when a store's newest fails to load
    (`spark_support.snapshot_repair`), so a fresh location keeps what that needs."""
    if plan.snapshot is None:
        livedir.clear(choice.lock.dir or choice.path)
        return {}, LiveReuse("empty", choice.path, reason=choice.reason)
    if choice.adopted:
        return {}, LiveReuse("adopted", choice.path, reason=choice.reason)
    if choice.in_place:
        return seed_index_in_place(plan.snapshot.metadata), LiveReuse("in-place", choice.path,
                                                                      reason=choice.reason)
    # A savepoint's (or another root's) files are not this job's shared files: checkpoints
    # must not reference them, so they are copied once (NO_CLAIM; `Checkpointer.prestore`).
    counts: dict[str, int] = {}
    index = materialize(plan.snapshot, choice.path, stored=plan.own_files, link_from=choice.link_from,
                        counts=counts, only_read=True, repair=repair, live=choice.lock.dir)
    return index, LiveReuse("materialized", choice.path, counts.get("linked", 0), counts.get("downloaded", 0),
                            choice.reason, counts.get("skipped", 0))


def seed_index_in_place(meta: SnapshotMetadata) -> dict[str, IndexEntry]:
    return {ref.path: IndexEntry(ref.size, ref.mtime_ns, ref) for ref in meta.files}
