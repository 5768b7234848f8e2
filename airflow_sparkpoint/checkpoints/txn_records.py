"""The sink transaction records of a job (``txn/<batch>-g<generation>.json``): written by
the driver before Spark commits the batch (the pre-commit record), read by every path
that settles transactions, deleted once settled. The one writer and reader of the
`TransactionRecord` record (`TransactionLog`); `Catalog` composes it.

A record is read bounded (`checkpoints.bounded`) and only as its job's: one of another
job, or of another batch or generation than its key names, is not this job's to settle
(`metadata.foreign_to`) and is skipped with a warning, as is an unreadable one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord, foreign_to
from airflow_sparkpoint.exceptions import CorruptRecord
from airflow_sparkpoint.storage import Storage

__all__ = ["TransactionLog"]

log = logging.getLogger(__name__)


class TransactionLog:
    """The transaction records of one job (`store`: its keys, at `uri`)."""

    def __init__(self, store: Storage, job: str, uri: str) -> None:
        self.store = store
        self.job = job
        self.uri = uri

    def put(self, record: TransactionRecord) -> None:
        """Record a staged transaction.

        :raises CatalogError: the record would be over the limits its readers accept (a
            batch staged in too many files); nothing is written.
        """
        key = layout.txn_key(record.batch_id, record.generation)
        body = json.dumps(record.to_json()).encode()
        bounded.check_writable(body, layout.limits_of(key), f"{self.uri}/{key}",
                               "the batch was staged in too many files; write it in fewer partitions")
        self.store.put(key, body)

    def records(self) -> list[TransactionRecord]:
        """Every recorded (not yet settled) transaction of this job, in batch order."""
        return sorted(self, key=lambda r: (r.batch_id, r.generation))

    def __iter__(self) -> Iterator[TransactionRecord]:
        """This job's recorded transactions, in key order, read one at a time (a reader that
        keeps only part of each holds one payload at a time)."""
        for info in self.store.list(layout.TXN):
            match = layout.TXN_RE.match(info.key.rsplit("/", 1)[-1])
            if not match:
                continue
            where = f"{self.uri}/{info.key}"
            try:
                record = bounded.read_record(self.store, info.key, TransactionRecord.from_json,
                                             limits=layout.limits_of(info.key), where=where)
            except CorruptRecord as exc:
                log.warning("skipping unreadable transaction record %s", exc)
                continue
            if record is None:
                continue  # settled meanwhile
            problem = foreign_to(record, self.job)
            if (problem is None
                    and (record.batch_id, record.generation) != (int(match.group(1)), int(match.group(2)))):
                problem = (f"it describes batch {record.batch_id} of generation "
                           f"{record.generation}, not the batch "
                           "and generation its key names")
            if problem is not None:
                log.warning("skipping transaction record %s: %s", where, problem)
                continue
            yield record

    def get(self, batch_id: int, generation: int) -> TransactionRecord | None:
        """The record of batch `batch_id` staged by `generation`, or None (settled, or never
        recorded).

        :raises CorruptRecord: it is unreadable, or describes another batch or job."""
        key = layout.txn_key(batch_id, generation)
        where = f"{self.uri}/{key}"
        record = bounded.read_record(self.store, key, TransactionRecord.from_json,
                                     limits=layout.limits_of(key), where=where)
        if record is None:
            return None
        problem = foreign_to(record, self.job)
        if problem is None and (record.batch_id, record.generation) != (batch_id, generation):
            problem = f"it describes batch {record.batch_id} of generation {record.generation}"
        if problem is not None:
            raise CorruptRecord(f"transaction record {where}: {problem}")
        return record

    def keys(self) -> set[tuple[int, int]]:
        """``(batch_id, generation)`` of every recorded transaction, from one listing. A
        record is deleted once its transaction committed or aborted, so a key missing here
        means the transaction is settled."""
        keys = set()
        for info in self.store.list(layout.TXN):
            match = layout.TXN_RE.match(info.key.rsplit("/", 1)[-1])
            if match:
                keys.add((int(match.group(1)), int(match.group(2))))
        return keys

    def delete(self, records: Iterable[TransactionRecord]) -> None:
        """Delete the records of settled transactions."""
        self.store.delete(layout.txn_key(r.batch_id, r.generation) for r in records)
