"""The external two-phase-commit step (`sparkpoint commit`, `SparkpointCommitOperator`).

Pure Python: reads the job's catalog, settles each record through the declared sink
(or, undeclared, one rebuilt from the record, confined: `sinks.resolve`), and drives it.
No Spark, no Airflow.

Which records are confirmed comes from the latest valid checkpoint: every checkpoint
lists the transactions still pending at its batch (the coordinator carries uncommitted
ones forward), so

==========================================================  ===========================
record                                                      action
==========================================================  ===========================
listed in the latest checkpoint (same batch and generation) commit, in batch order
batch <= the latest checkpoint's batch, not listed           abort: it can never be
                                                            confirmed (a dead
                                                            generation, a re-run)
batch > the latest checkpoint's batch                       left pending
no valid checkpoint at all                                  everything left pending
==========================================================  ===========================

Confirmed transactions always go through the sink's idempotent `commit`, which answers
"already" for a batch that landed before (and removes what a killed step left staged),
so a record whose commit landed but whose deletion did not is only cleaned up. Records are deleted from
the catalog once committed or aborted; running the step again is a no-op.

Exclusive promotion (invariant 8) is the sinks' own: each batch has one claim (file
sinks) or one app-transaction commit (Delta), and the step only follows it. Settling,
the conflict rule and the generation fence are the transaction service's
(`airflow_sparkpoint.sinks.transactions`): a record that holds its batch's claim is
finished, never aborted; a record whose batch another transaction holds is aborted with
its own staged data only; a *confirmed* record that lost its batch raises
`TransactionConflict` and stops the step with its record kept. The step acts as the
generation current when it read the catalog: a newer generation's records are never
its to abort (a restore with ``sinkAhead=rewind`` between the step's reads re-stages
batches at or below the checkpoint the step read), and a claim while it runs makes it
read the catalog again.

Which checkpoint is "the latest" is `Catalog.latest`'s answer (checkpoints of abandoned
lineages are not candidates).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.layout import parse_txn_id
from airflow_sparkpoint.checkpoints.lineage import Origin
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.snapshot_open import open_restart_snapshot, open_snapshot, restored_by
from airflow_sparkpoint.exceptions import InvalidPath, RestoreError, StaleGeneration, StorageError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.resolve import SinkSpec, check_job, declared_sink, resolve_sink, warn_undeclared
from airflow_sparkpoint.sinks.transactions import Settlement, settle_all

log = logging.getLogger(__name__)

__all__ = ["CommitStep", "Sinks", "commit_pending", "commit_step", "open_moved"]


class Sinks:
    """The sinks that settle the step's records (`resolve_sink`: the declared one, or
    one rebuilt per record config), each configured once."""

    def __init__(self, storage_options: Mapping[str, Any] | None, sink: SinkSpec | None, job: str) -> None:
        self._options = dict(storage_options or {})
        self._declared = declared_sink(sink)
        if self._declared is not None:
            self._declared.configure(self._options)
        self._job = job
        self._sinks: dict[tuple[str, str], Sink] = {}

    def of(self, record: TransactionRecord) -> Sink:
        check_job(record, self._job)  # another job's record is never this step's to settle
        if self._declared is not None:
            return resolve_sink(record, self._declared)
        if not self._sinks:
            warn_undeclared(self._job)
        config = record.payload.get("config") if isinstance(record.payload, Mapping) else None
        key = (record.sink, json.dumps(dict(config) if isinstance(config, Mapping) else None, sort_keys=True,
                                       default=str))
        sink = self._sinks.get(key)
        if sink is None:
            sink = resolve_sink(record, None)
            sink.configure(self._options)
            self._sinks[key] = sink
        return sink


def commit_pending(
    catalog: Catalog,
    *,
    storage_options: Mapping[str, Any] | None = None,
    upto_batch: int | None = None,
    sink: SinkSpec | None = None,
) -> dict[str, list[str]]:
    """Commit the confirmed transactions of `catalog`'s job and abort the dead ones.

    The step acts as the newest generation claimed when it starts (the fence of
    `airflow_sparkpoint.sinks.transactions`): records of a newer generation are left
    pending, and when a newer generation is claimed while the step runs (a restore that
    may start a new lineage), it reads the catalog again and goes on from there.

    :param storage_options: S3 connection options for the sinks (endpoint_url,
        region_name, aws_access_key_id, aws_secret_access_key, aws_session_token);
        empty means boto3's default chain.
    :param upto_batch: commit confirmed batches only up to this one (write-audit-publish:
        the audited range); later confirmed ones stay pending.
    :param sink: the job's sink (a `Sink` or its config mapping with ``kind``): records
        for any other sink are refused (`resolve_sink`). None rebuilds each record's sink
        from the record itself, confined to its root, with a warning.
    :returns: transaction ids by outcome: ``committed``, ``already`` (had landed before),
        ``aborted`` and ``pending`` (left for a later run).
    :raises TransactionConflict: a confirmed transaction lost its batch; nothing after it
        was committed and its record is kept.
    :raises SinkError: a commit failed; batches after it were not committed (order is
        kept), and the failed record stays for the next run. `CommitOutcomeUnknown` means
        it may have landed: running the step again finds out.
    :raises StaleGeneration: new generations kept being claimed while the step ran.
    """
    sinks = Sinks(storage_options, sink, catalog.job)
    settled: dict[str, list[str]] = {"committed": [], "already": [], "aborted": []}
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            pending = _commit_as_observed(catalog, sinks, upto_batch, settled)
        except StaleGeneration as exc:
            if attempt == _ATTEMPTS:
                raise
            log.warning("commit step of job %s: %s; reading the catalog again", catalog.job, exc)
            continue
        return {**settled, "pending": pending}
    raise AssertionError("unreachable")  # pragma: no cover


#: how often the commit step reads the catalog again when newer generations are claimed
_ATTEMPTS = 3


@dataclass(frozen=True)
class CommitStep:
    """What `commit_step` made visible: the transaction ids by outcome (`outcome`, as
    `commit_pending` returns them), those that landed (``committed`` and ``already``), the
    newest generation and the batches among them, and the latest checkpoint's URI."""

    outcome: dict[str, list[str]]
    landed: list[str]
    generation: int | None
    batches: list[int]
    last_checkpoint: str | None


def commit_step(
    catalog: Catalog,
    *,
    storage_options: Mapping[str, Any] | None = None,
    upto_batch: int | None = None,
    sink: SinkSpec | None = None,
) -> CommitStep:
    """`commit_pending`, and what it made visible (for an asset event, lineage facets).

    :raises: as `commit_pending`.
    """
    result = commit_pending(catalog, storage_options=storage_options, upto_batch=upto_batch, sink=sink)
    outcome = {key: list(value) for key, value in result.items()}
    landed = [*outcome.get("committed", ()), *outcome.get("already", ())]
    parsed = [p for p in map(parse_txn_id, landed) if p is not None]
    latest = catalog.latest()
    return CommitStep(outcome, landed, max((g for _job, _batch, g in parsed), default=None),
                      sorted({b for _job, b, _g in parsed}),
                      catalog.checkpoint_uri(latest.id) if latest else None)


def _standing(catalog: Catalog) -> SnapshotMetadata | None:
    """The snapshot the newest lineage stands at, the one ``restore=latest`` would restore:
    a checkpoint, or, before the lineage's first checkpoint, the savepoint or pin it
    started from (its ``_metadata`` lists the same transactions): in this job's root, or
    a moved savepoint on the root's own storage service (`_moved_start`). Never a
    checkpoint the lineage abandoned (`Catalog.latest` can be one: a fenced writer's late
    checkpoint once the origin that superseded it is pruned). None at empty state, at a
    snapshot of another job, of another service, or when nothing is restorable (logged):
    the step then commits and aborts nothing."""
    try:
        point = catalog.restart_point()
        if point.checkpoint is not None or point.uri is None or point.origin is None:
            return point.checkpoint
        if not catalog.snapshot_store.in_root(point.uri):
            return _moved_start(catalog, point.uri, point.origin)
        meta = open_restart_snapshot(point.uri, point.origin, catalog.snapshot_store.open_in_root).metadata
    except RestoreError as exc:
        log.warning("commit step of job %s: what the newest lineage stands at cannot be read (%s); "
                    "nothing is committed or aborted now", catalog.job, exc)
        return None
    return meta if meta.job == catalog.job else None


def _moved_start(catalog: Catalog, uri: str, origin: Origin) -> SnapshotMetadata | None:
    """The savepoint outside the root that `origin`'s lineage started from (a moved
    savepoint, restored by path: no pin), read through the root's store on its own
    service (`Storage.at`) with the checks of a restore: a valid ``_metadata`` of this
    job, every file present, and the snapshot `origin` restored (its id and batch). None
    (logged) on another service or when it is not that snapshot.

    :raises RestoreError: it is gone, unreadable or invalid.
    """
    meta = open_moved(catalog, uri)
    if meta is None:
        # Another service: read with options the step does not hold. The lineage's first
        # checkpoint lists what it confirms; until then nothing is settled (never aborted).
        log.info("commit step of job %s: the newest lineage (generation %d) stands at %s, on another storage "
                 "service than this job's root; its transactions are settled from its first checkpoint on",
                 catalog.job, origin.generation, uri)
        return None
    if meta.job != catalog.job or not restored_by(meta, origin):
        # Another job's (allowForeignJob: its records are not this job's to confirm) or
        # not the snapshot the lineage restored (replaced since): confirm nothing by it.
        log.warning("commit step of job %s: %s, where the newest lineage (generation %d) started, holds "
                    "snapshot %s of job %r (batch %s), not this job's snapshot %s (batch %s) it restored; "
                    "nothing is committed or aborted now", catalog.job, uri, origin.generation, meta.id,
                    meta.job, meta.batch_id, origin.snapshot_id, origin.batch_id)
        return None
    return meta


def open_moved(catalog: Catalog, uri: str) -> SnapshotMetadata | None:
    """The ``_metadata`` of the snapshot at `uri`, outside `catalog`'s root, read through the
    root's store on its own service (`Storage.at`) with a restore's checks (valid, every
    file present); None when `uri` is on another storage service (options not held here).

    :raises RestoreError: it is gone, unreadable or invalid.
    """
    try:
        store = catalog.store.at(uri)
    except InvalidPath as exc:
        raise RestoreError(str(exc)) from exc
    if store is None:
        return None
    try:
        return open_snapshot(uri, store=store).metadata  # no pin: pins are taken only inside the root
    except StorageError as exc:  # another bucket these credentials may not list: unreadable
        raise RestoreError(f"{uri} cannot be read: {exc}") from exc


def _commit_as_observed(
    catalog: Catalog, sinks: Sinks, upto_batch: int | None, settled: dict[str, list[str]]
) -> list[str]:
    """One pass of the commit step, fenced by the generation current when it starts;
    adds what it settled to `settled` and returns the ids left pending."""
    fence = Fence.observed(catalog)  # before the reads it acts on
    # The records before the origins (`latest`): a generation writes its origin before any
    # record, so every record read here belongs to a lineage `latest` then knows.
    records = catalog.transactions()
    if fence.generation and not catalog.has_origin(fence.generation):
        # Generation G is starting (claimed, its origin not yet written): it may restore an
        # older point, abort what that point does not confirm and check the sink's
        # position; the newest checkpoint `latest` would show now is of the lineage it may
        # abandon. Settle nothing until G's lineage is known (a start that died before its
        # origin is followed by the next one).
        log.warning("commit step of job %s: generation %d has no lineage origin yet "
                    "(it is starting); nothing "
                    "is committed or aborted now, run the step again", catalog.job, fence.generation)
        return [record.txn_id for record in records]
    latest = _standing(catalog)
    pending: list[str] = []
    confirmed = {(t.batch_id, t.generation) for t in latest.transactions} if latest is not None else set()
    to_commit: list[TransactionRecord] = []
    to_abort: list[TransactionRecord] = []
    for record in records:
        if not fence.admits(record):
            pending.append(record.txn_id)  # a newer generation's: not read with this checkpoint
        elif (record.batch_id, record.generation) in confirmed:
            if upto_batch is not None and record.batch_id > upto_batch:
                pending.append(record.txn_id)
            else:
                to_commit.append(record)
        elif latest is not None and record.batch_id <= latest.batch_id:
            to_abort.append(record)
        else:
            pending.append(record.txn_id)

    def note(settlement: Settlement, _done: int, _total: int) -> None:
        settled[settlement.outcome].append(settlement.record.txn_id)  # a conflict raises instead

    def note_abort(settlement: Settlement, done: int, total: int) -> None:
        note(settlement, done, total)
        faults.maybe_kill_halfway("abort", settlement.record.batch_id, done, total)

    try:
        # Commits always go through commit(): it is idempotent, and when the batch had
        # landed (a step killed halfway) it also removes what is left staged.
        settle_all(catalog, to_commit, sinks.of, confirmed=True, fence=fence, on_settled=note)
        settle_all(catalog, to_abort, sinks.of, confirmed=False, fence=fence, on_settled=note_abort)
    finally:
        log.info(
            "commit step of job %s as generation %s (latest checkpoint %s, batch %s): "
            "committed %s, already %s, "
            "aborted %s, pending %s",
            catalog.job, fence.generation, latest.id if latest else None, latest.batch_id if latest else None,
            settled["committed"], settled["already"], settled["aborted"], pending,
        )
    return pending
