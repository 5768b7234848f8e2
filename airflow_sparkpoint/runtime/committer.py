"""The committer: a run's sink transactions from their pre-commit record to their commit
(Flink's notifyCheckpointComplete), one concern apart from taking checkpoints.

It keeps the transactions that await their commit (those this run staged, and those the
restart point lists as pending), what every checkpoint records of them (the pending ones,
each batch's owning generation, the sink's position), and settles them through the one
rule for it (`sinks.transactions.settle_all`): commits every one a completed checkpoint
covers (``commit.mode=checkpoint``), in batch order, and aborts those a stop cancelled.
Every act is fenced by the run's generation (`Fence`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata
from airflow_sparkpoint.checkpoints.batch_owners import BatchOwners
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.checkpoints.run_result import BatchRanges
from airflow_sparkpoint.exceptions import SinkLineageError, SparkpointError
from airflow_sparkpoint.runtime.cutover import record_first_commit
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.transactions import Settlement, aborted_since, settle_all

log = logging.getLogger(__name__)

__all__ = ["PENDING_WARN", "Committer", "Recorded"]

#: pending transactions (commit.mode=external) past which a checkpoint warns: each one's
#: _metadata carries them all until the commit step commits them
PENDING_WARN = 1000


@dataclass(frozen=True)
class Recorded:
    """What a checkpoint of a batch records of the run's transactions."""

    transactions: tuple[TransactionRecord, ...]  # pending at the batch, in batch order
    batch_owners: BatchOwners  # which generation staged each batch of the lineage, up to it
    sink_positions: dict[str, Any]  # the sink's newest commit


class Committer:
    """The transactions of one generation's run, from record to commit (module docstring)."""

    #: green's run of a zero-downtime cutover: the agreed batch N it adopted the job at
    #: (its first commit, of N + 1, is the cutover's ``cutover_first_commit`` fault point)
    handover_batch: int | None = None

    def __init__(self, *, catalog: Catalog, sink: Sink, fence: Fence, commit_mode: str) -> None:
        self.catalog = catalog
        self.sink = sink
        self.fence = fence
        self.commit_mode = commit_mode
        self._lock = threading.Lock()  # the stream thread adds, the coordinator thread settles
        self.pending: dict[tuple[int, int], TransactionRecord] = {}
        self._pending_warn_at = PENDING_WARN
        self.batches_committed = BatchRanges()
        self.sink_positions: dict[str, Any] = {}
        #: which generation staged each batch of this run's lineage (carried into every snapshot)
        self.batch_owners = BatchOwners()
        #: whether the run's first commit was reported to its cutover (`runtime.cutover`)
        self._cutover_noted = False

    def seed(self, snapshot: SnapshotMetadata | None) -> None:
        """Start from a restored snapshot: its sink positions and its lineage's batch owners."""
        if snapshot is not None:
            self.sink_positions = dict(snapshot.sink_positions)
            self.batch_owners = snapshot.batch_owners.upto(snapshot.batch_id)

    def add_pending(self, record: TransactionRecord) -> None:
        """A transaction awaits its commit: one this run staged (its batch is this
        generation's from now on), or one the restart point lists as pending."""
        with self._lock:
            self.pending[(record.batch_id, record.generation)] = record
            if record.generation == self.fence.generation:
                self.batch_owners = self.batch_owners.with_batch(record.batch_id, record.generation)

    def add_owners(self, owners: Iterable[tuple[int, int]]) -> None:
        """``(batch, generation)`` of commits the sink holds for batches a restart replayed."""
        with self._lock:
            self.batch_owners = self.batch_owners.with_batches(owners)

    def recorded_at(self, batch_id: int) -> Recorded:
        """What the checkpoint of `batch_id` records: in ``external`` mode the transactions
        the commit step settled meanwhile are forgotten first (and a warning says when
        many wait for it).

        :raises StaleGeneration, SinkLineageError: see `_forget_settled`.
        """
        if self.commit_mode == "external":
            self._forget_settled()
        with self._lock:
            pending = tuple(sorted(
                (r for (b, _g), r in self.pending.items() if b <= batch_id),
                key=lambda r: (r.batch_id, r.generation),
            ))
            owners = self.batch_owners.upto(batch_id)
        if self.commit_mode == "external":
            self._warn_pending(len(pending))
        return Recorded(pending, owners, dict(self.sink_positions))

    def _warn_pending(self, count: int) -> None:
        """Say so when many transactions await the commit step (once per doubling)."""
        if count < PENDING_WARN:
            self._pending_warn_at = PENDING_WARN
        elif count >= self._pending_warn_at:
            self._pending_warn_at = 2 * count
            log.warning("%d transactions are pending commit (commit.mode=external): "
                        "each checkpoint's _metadata carries all of them until the commit step "
                        "(SparkpointCommitOperator, `sparkpoint commit`) commits them; run it more often",
                        count)

    def _forget_settled(self) -> None:
        """The external commit step committed some pending transactions (and deleted their
        records): later checkpoints must not list them as pending again. Only what was
        pending before the listing: a batch recorded since (Spark stages on its own thread)
        is recorded before it is added, so it is never taken for settled.

        A pending transaction is this lineage's: no settler aborts one while the run's
        generation is the newest. One the sink does not hold (`aborted_since`: the rule of
        a restart's recovery too) is output this run's state includes and the sink will
        never hold; the run stops before a checkpoint forgets it (a tripwire: found by a
        review, a rollback aborted the batches a running lineage's restart point confirms,
        and the run's later checkpoints dropped them without a word).

        :raises StaleGeneration: a newer generation was claimed (its lineage settled them).
        :raises SinkLineageError: an aborted one, while the run's generation is the newest;
            nothing was forgotten.
        """
        with self._lock:
            before = set(self.pending)
        recorded = self.catalog.transaction_keys()
        with self._lock:
            gone = [self.pending[k] for k in before if k not in recorded and k in self.pending]
        aborted = [r for r in gone if r.sink_id == self.sink.sink_id and aborted_since(self.sink, r)]
        if aborted:
            self.fence.check()
            first = min(aborted, key=lambda r: r.batch_id)
            raise SinkLineageError(
                f"transaction {first.txn_id} (batch {first.batch_id}) of {first.sink_id}, which this run's "
                "lineage confirms, was aborted and its record deleted while the run was live: its output "
                "is gone, and no checkpoint may go on without it. Nothing was checkpointed; restore a "
                "snapshot of the lineage the sink holds (see `sparkpoint list` and `sparkpoint history`)"
            )
        with self._lock:
            for record in gone:
                self.pending.pop((record.batch_id, record.generation), None)

    def commit_confirmed(self, checkpoint: SnapshotMetadata | None) -> list[int]:
        """Commit, in batch order, every pending transaction the completed `checkpoint`
        covers (``checkpoint`` commit mode; none before the run's first checkpoint).
        Returns the committed batch ids.

        :raises TransactionConflict: a confirmed transaction lost its batch (the conflict
            rule of `airflow_sparkpoint.sinks.transactions`); nothing after it is committed.
        :raises StaleGeneration: this generation was superseded.
        """
        if self.commit_mode != "checkpoint" or checkpoint is None:
            return []
        upto = checkpoint.batch_id
        with self._lock:
            ready = [r for (b, _g), r in self.pending.items() if b <= upto]

        def note(settlement: Settlement, _done: int, _total: int) -> None:
            record = settlement.record
            if self.handover_batch is not None and record.batch_id == self.handover_batch + 1:
                faults.maybe_kill("cutover_first_commit", record.batch_id)
            faults.maybe_kill("committed", record.batch_id)
            with self._lock:
                self.pending.pop((record.batch_id, record.generation), None)
            self.sink_positions[self.sink.sink_id] = {"batch": record.batch_id, **settlement.detail}
            self.batches_committed.add(record.batch_id)
            log.info("committed batch %d to %s (%s)", record.batch_id, self.sink.sink_id, settlement.outcome)

        settled = settle_all(self.catalog, ready, lambda _r: self.sink, confirmed=True, fence=self.fence,
                             on_settled=note)
        batches = [s.record.batch_id for s in settled]
        if batches and not self._cutover_noted:
            self._note_cutover(batches[0])
        return batches

    def _note_cutover(self, batch_id: int) -> None:
        """The run's first commit: if its generation is a cutover's green, that cutover
        ends ``committed`` (`runtime.cutover.record_first_commit`). A failure to write it
        fails no run (the output is committed either way): it is tried again at the
        next commit, and logged."""
        generation = self.fence.generation
        if generation is None:  # not a run's fence: no generation to be a cutover's green
            self._cutover_noted = True
            return
        try:
            record_first_commit(self.catalog, generation, batch_id)
        except SparkpointError as exc:
            log.warning("generation %d committed batch %d but could not record it in its cutover (tried "
                        "again at the next commit): %s", generation, batch_id, exc)
            return
        self._cutover_noted = True

    def abort_unconfirmed(self, after_batch: int | None) -> list[int]:
        """Settle as unconfirmed the pending transactions of batches after `after_batch` (a
        stop cancelled them): aborted, or finished when one holds its batch's commit."""
        with self._lock:
            doomed = [r for (b, _g), r in self.pending.items() if after_batch is None or b > after_batch]
            for record in doomed:
                self.pending.pop((record.batch_id, record.generation), None)

        def note(settlement: Settlement, done: int, total: int) -> None:
            if settlement.outcome != "aborted":
                log.warning("transaction %s holds its batch's commit; finished, not aborted",
                            settlement.record.txn_id)
            faults.maybe_kill_halfway("abort", settlement.record.batch_id, done, total)

        settle_all(self.catalog, doomed,
                   lambda _r: self.sink, confirmed=False, fence=self.fence, on_settled=note)
        return [r.batch_id for r in doomed]
