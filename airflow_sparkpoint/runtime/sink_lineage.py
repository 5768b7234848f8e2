"""Does the sink hold exactly what the restart point's lineage committed? (invariant 12)

A snapshot at batch N knows which generation staged each of its batches
(`SnapshotMetadata.batch_owners`) and which of its transactions were still pending
(confirmed, not yet committed) when it was taken. Restoring it is exact only when the
sink holds, at or below N, exactly that lineage's commits, and every pending one can
still be committed. Commits of a job land in batch order and every start checks this
before it commits anything, so it is enough to look at:

1. the sink's commit of its highest batch ``j <= N``: it must be the snapshot's own
   transaction of batch j (another lineage committed it otherwise: a restore by path of
   an older snapshot, a rewind, a stalled driver of an abandoned lineage);
2. every batch of the snapshot after j: it must be pending in the snapshot (else the
   lineage committed it and the sink no longer holds it: another lineage rewound it);
3. every pending transaction of the snapshot after j: its record must still be there and
   its abort not decided (a later recovery of another lineage aborted it otherwise, and
   its output is gone; the decision comes first, and stands), and the sink must not have
   held it and lost it (``behind``: read from the sink, also for a snapshot from another
   root, a moved savepoint, whose records are not in this catalog);
4. every pending transaction at or below j: the sink must hold exactly it (the commit
   step committed it since).

A divergence a rewind would fix (1, 2, or a ``behind`` of 3) also needs 3 for every pending
transaction the sink does not hold (the rewind goes below them): all of them are read,
past one the rewind brings back.

`divergence` finds the first violation, reading only; `runtime.restore.check_sink_position`
refuses it before anything is written, or, with ``restore.sinkAhead=rewind`` on a sink
that can rewind, rewinds the sink to the lineage's own commit (`Sink.rewind`). Snapshots
of an earlier release (no batch owners), of another job, and batches older than the
owners kept are not checked: there is nothing to compare with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle, SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.layout import txn_id
from airflow_sparkpoint.sinks.base import CommittedTxn, Sink

__all__ = ["Divergence", "divergence"]


@dataclass(frozen=True)
class Divergence:
    """How the sink differs from the restart point's lineage.

    `kind`: ``diverged`` (the sink's commit of `batch` is another lineage's), ``behind``
    (the lineage committed `batch` and the sink no longer holds it) or ``aborted`` (the
    snapshot's pending transaction of `batch` was aborted since: its output is gone).
    `rewindable`: a rewind to the lineage's own commit would make the sink exact.
    """

    kind: str
    batch: int
    expected: str  # the snapshot's transaction of `batch`
    held: CommittedTxn | None = None

    @property
    def rewindable(self) -> bool:
        return self.kind in ("diverged", "behind")

    def describe(self, sink: Sink, where: str) -> str:
        if self.kind == "diverged":
            holder = self.held.txn_id if self.held is not None and self.held.txn_id else "another transaction"
            return (f"sink {sink.sink_id} holds batch {self.batch} of another lineage "
                    f"({holder}), not {self.expected} "
                    f"that {where} continues from")
        if self.kind == "behind":
            return (f"sink {sink.sink_id} no longer holds batch {self.batch} "
                    f"({self.expected}), which the lineage of "
                    f"{where} committed (a restore of another lineage rewound it)")
        return (f"transaction {self.expected} (batch {self.batch}), which {where} lists "
                "as confirmed, was aborted "
                "since: its output is gone")


def divergence(snapshot: SnapshotHandle | None, sink: Sink, catalog: Catalog, job: str,
               *, own_root: bool) -> Divergence | None:
    """The first way `sink` differs from what `snapshot`'s lineage left it at the
    snapshot's batch (see the module docstring), or None. Reads only. `own_root`: the
    snapshot lives in `catalog`'s root (its pending transactions are recorded there).

    A divergence a rewind would fix is returned only when the rewound lineage can still
    commit every pending transaction it needs after the rewind: one aborted since is
    returned instead (not rewindable), so the start is refused before it writes.

    :raises SinkError: the sink cannot be read.
    """
    if snapshot is None:
        return None
    meta = snapshot.metadata
    if meta.job != job or not meta.batch_owners.ranges:
        return None
    pending = {t.batch_id: t for t in meta.transactions if t.job == job}
    recorded = catalog.transaction_keys() if own_root else None
    found = _first_divergence(meta, sink, job, pending, recorded)
    if found is not None and found.rewindable:
        # A rewind goes back to the lineage's own commit, below these: each must commit after
        # it. One it brings back (``behind``) says nothing of the ones above it: read them all.
        needed = [(batch, record) for batch, record in sorted(pending.items())
                  if not sink.is_committed(record)]
        lost = next((d for d in _unsettled(needed, sink, recorded) if d.kind == "aborted"), None)
        if lost is not None:
            return lost
    return found


def _first_divergence(meta: SnapshotMetadata, sink: Sink, job: str, pending: dict[int, TransactionRecord],
                      recorded: set[tuple[int, int]] | None) -> Divergence | None:
    owners = meta.batch_owners
    restart = meta.batch_id
    position = sink.committed_position(job)
    top = -1 if position is None else min(position, restart)
    if top >= 0:
        owner = owners.of(top)
        expected = pending[top].generation if top in pending else owner
        if expected is not None:
            held = _held(sink, job, top)
            if held is not None and held.generation is not None and held.generation != expected:
                return Divergence("diverged", top, txn_id(job, top, expected), held)
    for batch in range(top + 1, restart + 1):
        owner = owners.of(batch)
        if owner is not None and batch not in pending:
            return Divergence("behind", batch, txn_id(job, batch, owner))
    for batch, record in sorted(pending.items()):
        if batch < top:
            held = _held(sink, job, batch)
            if held is not None and held.generation is not None and held.generation != record.generation:
                return Divergence("diverged", batch, record.txn_id, held)
    return _pending_gone([(b, r) for b, r in sorted(pending.items()) if b > top], sink, recorded)


def _pending_gone(pending: list[tuple[int, TransactionRecord]], sink: Sink,
                  recorded: set[tuple[int, int]] | None) -> Divergence | None:
    """The first of `pending` (in batch order) that can no longer be committed (`_unsettled`)."""
    return next(_unsettled(pending, sink, recorded), None)


def _unsettled(pending: list[tuple[int, TransactionRecord]], sink: Sink,
               recorded: set[tuple[int, int]] | None) -> Iterator[Divergence]:
    """Each of `pending` (in batch order) that can no longer be committed as it is: settled
    since (``behind``: committed and then undone by another lineage's rewind, read from
    the sink also when `recorded` is None; ``aborted``: its record gone, never committed),
    or its abort decided. Lazily: a caller that stops early reads no more."""
    for batch, record in pending:
        # Its record gone: settled since. A snapshot from another root (a moved savepoint)
        # has no records here (`recorded` None), so only the sink can tell it was settled.
        settled = recorded is not None and (batch, record.generation) not in recorded
        if (settled or recorded is None) and not sink.is_committed(record):
            if sink.was_committed(record):
                yield Divergence("behind", batch, record.txn_id)
                continue
            if settled:
                yield Divergence("aborted", batch, record.txn_id)
                continue
        # Aborted, its record not yet deleted (an abort decides before it deletes). Every
        # decision is read: another lineage's recovery aborts what its own restart point
        # does not confirm and keeps, undecided, the lower batches it does.
        if sink.decision(record) == "abort":
            yield Divergence("aborted", batch, record.txn_id)


def _held(sink: Sink, job: str, batch: int) -> CommittedTxn | None:
    try:
        return sink.committed_txn(job, batch)
    except NotImplementedError:
        return None
