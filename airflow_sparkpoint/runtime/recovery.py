"""Restore-time recovery of sink transactions (Flink's recoverAndCommit /
recoverAndAbort), as the generation that claimed the restart: every recorded transaction
the restart point does not confirm is settled as unconfirmed (`settle_unconfirmed`);
those it confirms are committed (``checkpoint`` mode) or kept for the commit step
(``external``); staged data without any record is removed (`recover_transactions`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError, SinkLineageError
from airflow_sparkpoint.runtime.restore_plan import RestorePlan, under_root
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.resolve import resolve_sink
from airflow_sparkpoint.sinks.transactions import Settlement, aborted_since, settle_all

__all__ = ["recover_transactions", "settle_unconfirmed"]

log = logging.getLogger(__name__)


def _confirmed(plan: RestorePlan) -> dict[tuple[int, int], TransactionRecord]:
    """The transactions the restart snapshot lists as pending (confirmed by it)."""
    if plan.snapshot is None:
        return {}
    return {(r.batch_id, r.generation): r for r in plan.snapshot.metadata.transactions}


def _own(catalog: Catalog, record: TransactionRecord, sink: Sink, restored_job: str | None = None) -> bool:
    """Whether `record` was written for `sink` by this job (or by `restored_job`, whose
    snapshot this restore took): a record for another sink or of another job (planted in
    the store) is not this job's to settle; it is left in place with a warning."""
    try:
        resolve_sink(record, sink, job=catalog.job, restored_job=restored_job)
    except SinkError as exc:
        log.warning("%s; left in %s", exc, catalog.uri)
        return False
    return True


def settle_unconfirmed(
    catalog: Catalog, sink: Sink, plan: RestorePlan, generation: int | None = None
) -> dict[str, list[int]]:
    """recoverAndAbort, the first step of restore-time recovery, as the owner `generation`:
    every recorded transaction the restart snapshot does not list is settled as
    unconfirmed (`airflow_sparkpoint.sinks.transactions`): one that holds its batch's
    commit (possibly unfinished) is finished, never aborted; the rest can never be
    confirmed and are aborted, and their records deleted.

    It runs before the sink's position is checked: the abort is a decision a stalled
    committer of the same transaction (a zombie past its generation check) can no longer
    overturn, so nothing lands past the restart point after the check. Returns the batch
    ids ``finished`` and ``aborted``.

    :raises StaleGeneration: `generation` was superseded meanwhile; nothing more is touched.
    """
    faults.pause("recovery", plan.batch_id, generation=generation)
    confirmed = _confirmed(plan)
    summary: dict[str, list[int]] = {"finished": [], "aborted": []}

    def note(settlement: Settlement, done: int, total: int) -> None:
        summary["aborted" if settlement.outcome == "aborted" else "finished"].append(
            settlement.record.batch_id)
        faults.maybe_kill_halfway("recovery", settlement.record.batch_id, done, total)

    records = [r for r in catalog.transactions() if (r.batch_id, r.generation) not in confirmed]
    records = [r for r in records if _own(catalog, r, sink)]
    settle_all(catalog, records, lambda _r: sink, confirmed=False, fence=Fence(catalog, generation),
               on_settled=note)
    return summary


def recover_transactions(
    catalog: Catalog, sink: Sink, plan: RestorePlan, commit_mode: str, generation: int | None = None,
    *, settled: Mapping[str, list[int]] | None = None,
) -> tuple[list[TransactionRecord], dict[str, list[int]]]:
    """recoverAndCommit / recoverAndAbort for the restart point, as the owner `generation`.

    Transactions the snapshot lists as pending were confirmed: committed now in
    ``checkpoint`` mode, kept for the commit step in ``external`` mode. Every other
    recorded transaction is settled by `settle_unconfirmed` (here, unless the caller did
    that already and passes its summary as `settled`); a confirmed record naming another
    sink is left alone with a warning (`_own`), like an unconfirmed one; staged data
    without any record is removed. Every commit and abort is fenced: a newer generation makes this one stop.
    Returns the still-pending records and a summary (batch ids ``committed``,
    ``finished``, ``aborted``, ``kept``; ``conflicts`` stays empty: a conflict raises).

    :raises StaleGeneration: `generation` was superseded meanwhile; nothing more is touched.
    :raises TransactionConflict: a confirmed transaction lost its batch to another one
        (the conflict rule of `airflow_sparkpoint.sinks.transactions`, the commit step's
        too): nothing after it is committed and its record is kept.
    """
    if settled is None:
        settled = settle_unconfirmed(catalog, sink, plan, generation)
    fence = Fence(catalog, generation)
    confirmed = _confirmed(plan)
    summary: dict[str, list[int]] = {"committed": [], "finished": list(settled.get("finished", ())),
                                     "aborted": list(settled.get("aborted", ())), "kept": [], "conflicts": []}
    still_pending: list[TransactionRecord] = []
    to_commit: list[TransactionRecord] = []
    recorded = catalog.transaction_keys()
    # Only this job's own records tell "settled"; a snapshot from another root (a moved
    # savepoint) has none here, and its sinks refuse transactions whose data is gone.
    own_root = plan.snapshot is not None and under_root(plan.snapshot.uri, catalog.uri)
    for key, record in sorted(confirmed.items()):
        if record.job != catalog.job and record.sink_id and record.sink_id != sink.sink_id:
            # A snapshot of another job restored into other output (a restore drill, a
            # fork): the transaction's staged data lives in that job's sink, which commits
            # it on its own recovery or commit step; this run must neither commit nor abort it.
            log.warning("transaction %s was pending for sink %s in %s; this run writes to "
                        "%s: leaving it to job %r",
                        record.txn_id, record.sink_id, plan.snapshot.uri if plan.snapshot else "the snapshot",
                        sink.sink_id, record.job)
            continue
        if not _own(catalog, record, sink, plan.snapshot.metadata.job if plan.snapshot else None):
            # the rule of `settle_unconfirmed`: another sink's or job's record stays
            continue
        if own_root and key not in recorded:
            # Settled after the snapshot was taken: committed (then the sink has it) or
            # aborted (a discarded audit, a rollback, another lineage's recovery). Aborted,
            # its output is gone while the snapshot's state is past its batch: restoring
            # it loses the batch (`sink_lineage` refuses that before the claim; this is
            # an abort that landed since).
            if aborted_since(sink, record):
                # A newer generation's recovery may have aborted it (it restored another
                # snapshot): then this start is stale, not its snapshot damaged.
                fence.check()
                raise SinkLineageError(
                    f"transaction {record.txn_id} (batch {record.batch_id}), which "
                    f"{plan.snapshot.uri if plan.snapshot else 'the snapshot'} lists as "
                    "confirmed, was aborted since: its "
                    "output is gone, and restoring the snapshot would lose the batch. Restore "
                    "an earlier snapshot, or "
                    "one of the lineage the sink holds (see `sparkpoint list`)"
                )
            continue
        if commit_mode == "checkpoint":
            to_commit.append(record)
        else:
            still_pending.append(record)
            summary["kept"].append(record.batch_id)
    for settlement in settle_all(catalog, to_commit,
                                 lambda _r: sink, confirmed=True, fence=fence, recorded=recorded):
        summary["committed"].append(settlement.record.batch_id)
    # Staged data no record names is garbage; what a record names now (read again: a
    # newer generation may have recorded meanwhile) and any newer generation's is not ours.
    keep = {r.txn_id for r in still_pending} | {r.txn_id for r in catalog.transactions()}
    fence.check()
    removed = sink.cleanup_orphans(catalog.job, keep, upto_generation=generation)
    if removed:
        log.info("removed %d orphaned staged item(s) of job %s", removed, catalog.job)
    return still_pending, summary
