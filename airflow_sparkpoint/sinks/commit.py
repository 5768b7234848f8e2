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
sinks) or one app-transaction commit (Delta), and the step only follows it. A record
that holds its batch's claim is finished, never aborted (an abort of it is refused, and
the step finishes it instead); a record whose batch another transaction holds is aborted
with its own staged data only. A *confirmed* record that lost its batch to another
transaction (a stalled driver of an abandoned lineage promoted first) raises
`TransactionConflict`: the step stops there, since committing the batches after it
would mix two lineages' output; its staged data is discarded and the record is kept, so
every later run reports the conflict until a person restores a consistent point.

Which checkpoint is "the latest" is `Catalog.latest`'s answer (checkpoints of abandoned
lineages are not candidates).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.resolve import SinkSpec, declared_sink, resolve_sink, warn_undeclared

log = logging.getLogger(__name__)

__all__ = ["abort_generation", "commit_pending"]


class _Sinks:
    """The sinks that settle the step's records (`resolve_sink`: the declared one, or
    one rebuilt per record config), each configured once."""

    def __init__(self, storage_options: Mapping[str, Any] | None, sink: SinkSpec | None = None,
                 job: str = "") -> None:
        self._options = dict(storage_options or {})
        self._declared = declared_sink(sink)
        if self._declared is not None:
            self._declared.configure(self._options)
        self._job = job
        self._sinks: dict[tuple[str, str], Sink] = {}

    def of(self, record: TransactionRecord) -> Sink:
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
    :raises SinkError: a commit failed; batches after it were not committed (order is
        kept), and the failed record stays for the next run. `CommitOutcomeUnknown` means
        it may have landed: running the step again finds out.
    """
    latest = catalog.latest()
    records = catalog.transactions()
    result: dict[str, list[str]] = {"committed": [], "already": [], "aborted": [], "pending": []}
    confirmed = {(t.batch_id, t.generation) for t in latest.transactions} if latest is not None else set()
    to_commit: list[TransactionRecord] = []
    to_abort: list[TransactionRecord] = []
    for record in records:
        if (record.batch_id, record.generation) in confirmed:
            if upto_batch is not None and record.batch_id > upto_batch:
                result["pending"].append(record.txn_id)
            else:
                to_commit.append(record)
        elif latest is not None and record.batch_id <= latest.batch_id:
            to_abort.append(record)
        else:
            result["pending"].append(record.txn_id)
    sinks = _Sinks(storage_options, sink, catalog.job)
    try:
        for record in sorted(to_commit, key=lambda r: (r.batch_id, r.generation)):
            # Always through commit(): it is idempotent, and when the batch had landed (a
            # step killed halfway) it also removes what is left staged.
            outcome = sinks.of(record).commit(record)
            result["committed" if outcome.status == "committed" else "already"].append(record.txn_id)
            catalog.delete_transactions([record])
        for count, record in enumerate(to_abort, start=1):
            committed = _abort_unless_committed(sinks.of(record), record)
            result["already" if committed else "aborted"].append(record.txn_id)
            catalog.delete_transactions([record])
            faults.maybe_kill_halfway("abort", record.batch_id, count, len(to_abort))
    finally:
        log.info(
            "commit step of job %s (latest checkpoint %s, batch %s): committed %s, already %s, aborted %s, "
            "pending %s",
            catalog.job,
            latest.id if latest else None,
            latest.batch_id if latest else None,
            result["committed"], result["already"], result["aborted"], result["pending"],
        )
    return result


def abort_generation(
    catalog: Catalog, generation: int, storage_options: Mapping[str, Any] | None = None,
    sink: SinkSpec | None = None,
) -> list[str]:
    """Abort every uncommitted transaction of `generation` and delete its record.

    The blue-green rollback: green's staged output (confirmed by green's checkpoints or
    not) never becomes visible, and green's checkpoints from the first aborted batch on
    are retired so that no later restore picks them. Transactions that already committed
    are left alone and reported in the log. Returns the aborted transaction ids.
    `sink` is the job's sink, as for `commit_pending`.
    """
    sinks = _Sinks(storage_options, sink, catalog.job)
    aborted: list[str] = []
    first_aborted: int | None = None
    mine = [record for record in catalog.transactions() if record.generation == generation]
    # Retire first: a rollback killed after deleting a record but before retiring would
    # leave its checkpoint restorable by `restore=latest` with its output gone, and the
    # retried rollback no longer sees that record.
    uncommitted = [r.batch_id for r in mine if not sinks.of(r).is_committed(r)]
    if uncommitted:
        _retire_checkpoints(catalog, generation, min(uncommitted))
    for count, record in enumerate(mine, start=1):
        if _abort_unless_committed(sinks.of(record), record):
            log.warning("transaction %s of generation %d has already committed to %s; not aborted",
                        record.txn_id, generation, record.sink_id)
            continue
        catalog.delete_transactions([record])
        aborted.append(record.txn_id)
        first_aborted = record.batch_id if first_aborted is None else min(first_aborted, record.batch_id)
        faults.maybe_kill_halfway("abort", record.batch_id, count, len(mine))
    log.info("aborted %d transaction(s) of generation %d of job %s: %s",
             len(aborted), generation, catalog.job, aborted)
    if first_aborted is not None:
        _retire_checkpoints(catalog, generation, first_aborted)
    return aborted


def _abort_unless_committed(sink: Sink, record: TransactionRecord) -> bool:
    """Abort `record`, or finish it when it holds its batch's commit (a commit that landed,
    or a promotion decided and left unfinished: the sink's abort refuses those). Returns
    True when it is committed, False when it was aborted (with its own staged data only).

    :raises SinkError: the abort failed and the transaction is not committed.
    """
    if sink.is_committed(record):
        sink.commit(record)  # idempotent; finishes what a killed step left unfinished
        return True
    try:
        sink.abort(record)
    except SinkError:
        if not sink.is_committed(record):
            raise
        sink.commit(record)
        return True
    return False


def _retire_checkpoints(catalog: Catalog, generation: int, first_aborted: int) -> None:
    """A checkpoint of `generation` at or after an aborted batch holds state whose output
    is gone: restoring it (say, a later ``restore=latest``) would lose that output. Its
    ``_metadata`` goes, so it is never restored; retention collects its files."""
    for meta in catalog.checkpoints():
        if meta.generation == generation and meta.batch_id >= first_aborted:
            catalog.dispose(catalog.checkpoint_uri(meta.id))
            log.warning("retired checkpoint %d (batch %d) of rolled-back generation %d of job %s",
                        meta.id, meta.batch_id, generation, catalog.job)
