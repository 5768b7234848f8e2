"""The transaction service: the one rule for settling a recorded sink transaction.

Every caller that commits or aborts a recorded transaction goes through `settle` (one
transaction) or `settle_all` (several, in batch order, records deleted as they settle):
the coordinator (commit on confirmation, abort at a stop), restore-time recovery
(recoverAndCommit / recoverAndAbort), the external commit step and the blue-green
rollback (`abort_generation`).

**Settling.** A *confirmed* transaction is committed through the sink's idempotent
``commit`` (which answers "already" for one that landed before). Any other transaction
is aborted, unless it holds its batch's commit (landed, or a promotion decided and left
unfinished): then it is finished, never aborted; an abort the sink refuses is re-checked
the same way. Outcomes (`Outcome`):

=============  ==================================================================
``committed``  this call made it visible
``already``    it had landed before (or held its batch's claim and was finished)
``aborted``    its staged data is discarded; it never becomes visible
``conflict``   confirmed, but another transaction holds its batch (a stalled
               driver of an abandoned lineage promoted first); the sink discarded
               this one's staged data
=============  ==================================================================

**The conflict rule.** A conflict stops its caller (`TransactionConflict`) and its record
is kept: committing the batches after it would mix two lineages' output, so every later
attempt reports it until a person restores a consistent point. A conflict met after a
newer generation was claimed is that generation's doing (its lineage abandoned this one):
the caller gets `StaleGeneration` and reads the catalog again; so does a commit refused
because a rollback fenced the caller and decided the transaction's abort.

**The fence.** A caller acts *as* a generation (`checkpoints.generations.Fence`): a driver
as its own; the commit step and the rollback as the newest generation claimed when they
started (`Fence.observed`), since a generation claimed after that may start a new lineage whose
restore point, sink position and records they never read. Before every act the fence
checks that no newer generation was claimed (`StaleGeneration` otherwise), and a record
of a generation newer than the fence's is never the caller's to settle (`Fence.admits`).
The check narrows the window to one act; the second rule closes it for a newer lineage's
own transactions, which a stale caller therefore never aborts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_sparkpoint.checkpoints.commit_head import record_commit
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError, TransactionConflict
from airflow_sparkpoint.sinks.base import Sink

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

log = logging.getLogger(__name__)

__all__ = ["OUTCOMES", "Outcome", "Settlement", "aborted_since", "settle", "settle_all"]

Outcome = Literal["committed", "already", "aborted", "conflict"]
OUTCOMES: tuple[Outcome, ...] = ("committed", "already", "aborted", "conflict")


def aborted_since(sink: Sink, record: TransactionRecord) -> bool:
    """Whether the transaction of `record`, whose record is gone from the catalog, was
    aborted: a record is deleted only once its transaction is settled, so one the sink
    does not hold never will be (read from the sink)."""
    return not sink.is_committed(record)


@dataclass(frozen=True)
class Settlement:
    """How one transaction was settled; `detail` is the sink's (a commit's position),
    `conflict` the sink's error naming the transaction that holds the batch."""

    record: TransactionRecord
    outcome: Outcome
    detail: dict[str, Any] = field(default_factory=dict)
    conflict: TransactionConflict | None = field(default=None, compare=False)


def settle(sink: Sink, record: TransactionRecord, *, confirmed: bool, fence: Fence) -> Settlement:
    """Commit `record` if `confirmed`, else abort it unless it holds its batch's commit
    (then finish it); the fence is checked first.

    :raises StaleGeneration: the fence's generation was superseded; nothing was done (or
        the commit failed because of the newer generation: it lost its batch, its staged
        data discarded, or a rollback decided its abort).
    :raises SinkError: the commit or abort failed (`CommitOutcomeUnknown`: it may have
        landed, keep the record and look again).
    """
    fence.check()
    if confirmed:
        try:
            outcome = sink.commit(record)
        except SinkError as exc:
            # Lost its batch to, or aborted by, a generation claimed since the check above
            # (a newer lineage or a rollback abandoned this one): the caller's view is
            # stale, not a loss.
            fence.check()
            if not isinstance(exc, TransactionConflict):
                raise
            log.warning("transaction %s was not committed: %s", record.txn_id, exc)
            return Settlement(record, "conflict", conflict=exc)
        return Settlement(record, "committed" if outcome.status == "committed" else "already",
                          dict(outcome.detail))
    if sink.is_committed(record):
        # It holds its batch's commit (landed, or a promotion killed halfway): finish it;
        # aborting would delete data the sink already shows.
        return Settlement(record, "already", dict(sink.commit(record).detail))
    try:
        sink.abort(record)
    except SinkError:
        if not sink.is_committed(record):
            raise
        # Its stalled committer had decided to promote: finish what it started.
        return Settlement(record, "already", dict(sink.commit(record).detail))
    return Settlement(record, "aborted")


def settle_all(
    catalog: Catalog,
    records: Iterable[TransactionRecord],
    sink_of: Callable[[TransactionRecord], Sink],
    *,
    confirmed: bool,
    fence: Fence,
    on_settled: Callable[[Settlement, int, int], None] | None = None,
    recorded: Collection[tuple[int, int]] | None = None,
) -> list[Settlement]:
    """Settle `records` in batch order and delete each one's record once settled.

    `on_settled(settlement, done, total)` runs after each settle, before the record is
    deleted (progress, fault hooks). A settlement that left the batch visible
    (``committed``, ``already``) moves the job's commit head (`record_commit`: what asset
    watchers poll) before the record is deleted. Records the fence does not admit are skipped. With
    `recorded` (the catalog's ``(batch, generation)`` keys), only records listed there
    are deleted (a restored snapshot may list transactions this catalog never recorded).

    :raises TransactionConflict: a confirmed record lost its batch (the conflict rule):
        it and every later one are left as they are.
    :raises StaleGeneration: see `settle`; what was settled before stays settled.
    :raises SinkError: see `settle`; the failed record and later ones stay.
    """
    todo = sorted((r for r in records if fence.admits(r)), key=lambda r: (r.batch_id, r.generation))
    done: list[Settlement] = []
    for count, record in enumerate(todo, start=1):
        settlement = settle(sink_of(record), record, confirmed=confirmed, fence=fence)
        if settlement.conflict is not None:
            raise settlement.conflict
        if on_settled is not None:
            on_settled(settlement, count, len(todo))
        if settlement.outcome in ("committed", "already"):
            record_commit(catalog, record, settlement.detail, landed_before=settlement.outcome == "already")
        elif settlement.outcome == "aborted":
            # An abort decided by a run stalled past a newer claim keeps its record: the
            # newer lineage then finds the decision (and refuses to commit that batch and
            # those after it) instead of committing past a batch that is gone.
            fence.check()
        if recorded is None or (record.batch_id, record.generation) in recorded:
            catalog.transaction_log.delete([record])
        done.append(settlement)
    return done
