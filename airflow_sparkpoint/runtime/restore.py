"""Choosing and preparing the restart point of a run (``spark.sparkpoint.restore``).

``latest``  resume in place when the live location is exactly at the latest completed
            checkpoint, otherwise materialize that checkpoint into a fresh location;
``none``    empty state (refused when the job already has checkpoints, unless forced);
a path      a savepoint or retained checkpoint, materialized into a fresh location.

Before anything is touched, every sink is asked for its committed position
(invariant 4): restoring a snapshot the sink has already moved past is refused.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle, SnapshotMetadata, open_snapshot
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import RestoreError, SinkAheadError
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.coordinator import IndexEntry, file_sha256
from airflow_sparkpoint.sinks.base import Sink

log = logging.getLogger(__name__)

# Small text files of Spark's checkpoint that may embed the absolute checkpoint path
# (transformWithState's operator metadata records its state schema file paths).
_REWRITE_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class RestorePlan:
    """What the run starts from."""

    snapshot: SnapshotHandle | None  # None: empty state
    resume_in_place: str | None  # the previous live location, when reused as it is
    description: str

    @property
    def batch_id(self) -> int | None:
        return self.snapshot.metadata.batch_id if self.snapshot else None


def plan_restore(cfg: SparkpointConfig, catalog: Catalog, previous_live: str | None) -> RestorePlan:
    """Decide the restart point without changing anything.

    :raises RestoreError: a missing, corrupt or foreign restore target, or ``none`` on a
        job that has checkpoints (without ``restore.force``).
    """
    if cfg.restore == "none":
        latest = catalog.latest()
        if latest is not None and not cfg.restore_force:
            raise RestoreError(
                f"spark.sparkpoint.restore=none but job {cfg.job!r} has completed checkpoints "
                f"(latest: {catalog.checkpoint_uri(latest.id)}); set spark.sparkpoint.restore.force=true to start "
                "with empty state anyway, or use restore=latest"
            )
        return RestorePlan(None, None, "empty state (restore=none)")
    if cfg.restore == "latest":
        latest = catalog.latest()
        if latest is None:
            return RestorePlan(None, None, "empty state (no completed checkpoint yet)")
        handle = catalog.handle(latest)
        if previous_live and _live_matches(previous_live, latest):
            return RestorePlan(handle, previous_live, f"resume in place at batch {latest.batch_id} ({handle.uri})")
        return RestorePlan(handle, None, f"latest checkpoint {handle.uri} (batch {latest.batch_id})")
    handle = open_snapshot(cfg.restore, storage_options=cfg.storage_options)
    meta = handle.metadata
    if meta.job != cfg.job and not cfg.restore_allow_foreign_job:
        raise RestoreError(
            f"restore target {handle.uri} belongs to job {meta.job!r}, not {cfg.job!r}; set "
            "spark.sparkpoint.restore.allowForeignJob=true to restore it into this job"
        )
    return RestorePlan(handle, None, f"{meta.kind} {handle.uri} (batch {meta.batch_id})")


def _live_matches(live: str, latest: SnapshotMetadata) -> bool:
    """The previous live location is exactly at `latest` and of the same query lineage."""
    path = livedir.local_path_of(live)
    if path is None or not os.path.isdir(path):
        return False
    if livedir.last_commit(path) != latest.batch_id:
        return False
    meta_ref = next((f for f in latest.files if f.path == "metadata"), None)
    try:
        return meta_ref is not None and file_sha256(os.path.join(path, "metadata")) == meta_ref.sha256
    except FileNotFoundError:
        return False


def check_sink_position(plan: RestorePlan, sink: Sink, job: str, policy: str) -> None:
    """Invariant 4: refuse (or, with ``restore.sinkAhead=rewind``, rewind the sink) when the
    sink has committed batches of `job` beyond the restart point.

    :raises SinkAheadError: the sink is ahead and the policy is ``fail`` (or rewinding is refused).
    """
    position = sink.committed_position(job)
    restart = plan.batch_id
    if position is None or (restart is not None and position <= restart):
        return
    where = f"batch {restart} of {plan.snapshot.uri}" if plan.snapshot else "empty state"
    if policy == "rewind" and plan.snapshot is not None and hasattr(sink, "rewind"):
        log.warning("sink %s is at batch %d, past %s: rewinding it (restore.sinkAhead=rewind)",
                    sink.sink_id, position, where)
        sink.rewind(job, plan.snapshot.metadata)
        faults.maybe_kill("rewind", plan.snapshot.metadata.batch_id)
        return
    raise SinkAheadError(
        f"sink {sink.sink_id} has already committed batch {position} of job {job!r}, past the restore point "
        f"({where}); restoring would duplicate or lose output. Restore a newer checkpoint or savepoint, or set "
        "spark.sparkpoint.restore.sinkAhead=rewind to rewind the sink to the snapshot"
    )


def materialize(handle: SnapshotHandle, live_path: str, *, stored: bool = True) -> dict[str, IndexEntry]:
    """Rebuild Spark's checkpoint location at `live_path` from a snapshot (which is never
    modified: NO_CLAIM). Returns the file index that lets the next checkpoint reuse the
    stored files (`stored`: the snapshot's files are this job's shared files) or at least
    their known checksums (they live in another store and must be copied once)."""
    if os.path.exists(live_path):
        shutil.rmtree(live_path)
    os.makedirs(live_path)
    meta = handle.metadata
    old_roots = _path_forms(meta.live_root) if meta.live_root else []
    new_root = os.path.abspath(live_path)
    index: dict[str, IndexEntry] = {}
    for ref in meta.files:
        target = os.path.join(live_path, *ref.path.split("/"))
        handle.files_store.download_file(ref.key, target)
        rewritten = False
        if old_roots and ref.size <= _REWRITE_MAX_BYTES:
            rewritten = _rewrite_paths(target, old_roots, new_root)
        if not rewritten:
            st = os.stat(target)
            index[ref.path] = IndexEntry(st.st_size, st.st_mtime_ns, ref, stored=stored)
    log.info("materialized %d files (%d bytes) of %s into %s", len(meta.files), meta.total_bytes, handle.uri, live_path)
    return index


def seed_index_in_place(meta: SnapshotMetadata) -> dict[str, IndexEntry]:
    return {ref.path: IndexEntry(ref.size, ref.mtime_ns, ref) for ref in meta.files}


def _path_forms(root: str) -> list[bytes]:
    root = root.rstrip("/")
    return sorted({f"file:{root}".encode(), f"file://{root}".encode(), root.encode()}, key=len, reverse=True)


def _rewrite_paths(path: str, old_roots: list[bytes], new_root: str) -> bool:
    with open(path, "rb") as source:
        data = source.read()
    if not any(old in data for old in old_roots):
        return False
    # One pass over all forms, longest first, so a replacement is never replaced again.
    pattern = re.compile(b"|".join(re.escape(old) for old in old_roots))

    def swap(match: re.Match[bytes]) -> bytes:
        old = match.group(0)
        scheme = b"file://" if old.startswith(b"file://") else b"file:" if old.startswith(b"file:") else b""
        return scheme + new_root.encode()

    data = pattern.sub(swap, data)
    tmp = path + ".sparkpoint-tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
    return True


def recover_transactions(
    catalog: Catalog, sink: Sink, plan: RestorePlan, commit_mode: str
) -> tuple[list[TransactionRecord], dict[str, list[int]]]:
    """recoverAndCommit / recoverAndAbort for the restart point.

    Transactions the snapshot lists as pending were confirmed: committed now in
    ``checkpoint`` mode, kept for the commit step in ``external`` mode. Every other
    recorded transaction of this job can never be confirmed and is aborted; staged data
    without any record is removed. Returns the still-pending records and a summary.
    """
    restart = plan.batch_id
    confirmed: dict[tuple[int, int], TransactionRecord] = {}
    if plan.snapshot is not None:
        confirmed = {(r.batch_id, r.generation): r for r in plan.snapshot.metadata.transactions}
    summary: dict[str, list[int]] = {"committed": [], "aborted": [], "kept": []}
    still_pending: list[TransactionRecord] = []
    recorded = catalog.transaction_keys()
    # Only this job's own records tell "settled"; a snapshot from another root (a moved
    # savepoint) has none here, and its sinks refuse transactions whose data is gone.
    own_root = plan.snapshot is not None and _under(plan.snapshot.uri, catalog.uri)
    for key, record in sorted(confirmed.items()):
        if record.job != catalog.job and record.sink_id and record.sink_id != sink.sink_id:
            # A snapshot of another job restored into other output (a restore drill, a
            # fork): the transaction's staged data lives in that job's sink, which commits
            # it on its own recovery or commit step; this run must neither commit nor abort it.
            log.warning("transaction %s was pending for sink %s in %s; this run writes to %s: leaving it to job %r",
                        record.txn_id, record.sink_id, plan.snapshot.uri if plan.snapshot else "the snapshot",
                        sink.sink_id, record.job)
            continue
        if own_root and key not in recorded:
            # Settled after the snapshot was taken: committed (then the sink has it) or
            # aborted by the commit step (a rejected audit, a rolled-back generation).
            # Either way it must not be committed again.
            if not sink.is_committed(record):
                log.warning("transaction %s listed by %s was aborted since; not committing it",
                            record.txn_id, plan.snapshot.uri if plan.snapshot else "the snapshot")
            continue
        if commit_mode == "checkpoint":
            sink.commit(record)
            summary["committed"].append(record.batch_id)
        else:
            still_pending.append(record)
            summary["kept"].append(record.batch_id)
    records = catalog.transactions()
    done = []
    for count, record in enumerate(records, start=1):
        key = (record.batch_id, record.generation)
        if key in confirmed:
            if commit_mode == "checkpoint":
                done.append(record)
            continue
        if restart is not None and record.batch_id <= restart and sink.is_committed(record):
            done.append(record)  # landed before the snapshot was taken; only the record is stale
            continue
        sink.abort(record)
        summary["aborted"].append(record.batch_id)
        done.append(record)
        faults.maybe_kill_halfway("recovery", record.batch_id, count, len(records))
    catalog.delete_transactions(done)
    keep = {r.txn_id for r in still_pending}
    removed = sink.cleanup_orphans(catalog.job, keep)
    if removed:
        log.info("removed %d orphaned staged item(s) of job %s", removed, catalog.job)
    return still_pending, summary


def _under(uri: str, root: str) -> bool:
    """Whether `uri` lies under `root`; plain paths and ``file://`` URIs compare alike."""

    def canonical(text: str) -> str:
        local = livedir.local_path_of(text)
        return (local if local is not None else text).rstrip("/")

    return canonical(uri).startswith(canonical(root) + "/")
