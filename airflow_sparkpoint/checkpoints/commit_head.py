"""The commit head of a job: the newest sink commit, one small record that Airflow's asset
watchers poll (``<job>/committed.json``; `SparkpointCommitTrigger`).

Written by the transaction service (`sinks.transactions.settle_all`) after a sink
confirmed a commit, so it only ever names output that readers of the sink can see:
never a staged batch, never an aborted one. Every committer goes through it (the running
job, restore-time recovery, the external commit step)::

    {"schema_version": 1, "seq": 42, "job": "orders", "batch": 17, "generation": 5,
     "txn_id": "orders-b17-g5", "sink_id": "delta:s3://b/t", "sink_version": 23,
     "committed_at": 1795307061.1}

`seq` grows by one with every commit written, so a watcher compares one integer (batch
ids alone repeat after a ``restore.sinkAhead=rewind``). Writers take the previous head
without a conditional put: two committers of one job at once (which the generation fence
makes a misuse) could both write the same `seq`; a watcher then reports the two commits
as one. A failed write is logged and never fails the commit: the data landed, and the
next commit writes the head again.

Pure Python over a `Catalog`: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import bounded
from airflow_sparkpoint.checkpoints.layout import COMMITTED, limits_of
from airflow_sparkpoint.exceptions import StorageError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.metadata import TransactionRecord

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

__all__ = ["CommitHead", "read_commit_head", "record_commit"]


@dataclass(frozen=True)
class CommitHead:
    """The newest commit of a job's output (see the module docstring)."""

    seq: int
    job: str
    batch: int
    generation: int
    txn_id: str
    sink_id: str
    sink_version: int | None = None
    committed_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommitHead:
        """:raises ValueError: malformed, or of a newer schema version."""
        version = data.get("schema_version", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"commit head has schema_version {version!r}; this release "
                             f"reads <= {SCHEMA_VERSION}")
        try:
            sink_version = data.get("sink_version")
            return cls(seq=int(data["seq"]), job=str(data["job"]), batch=int(data["batch"]),
                       generation=int(data["generation"]), txn_id=str(data["txn_id"]),
                       sink_id=str(data["sink_id"]),
                       sink_version=None if sink_version is None else int(sink_version),
                       committed_at=float(data.get("committed_at", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"commit head is malformed ({exc.__class__.__name__}: {exc})") from None


def read_commit_head(catalog: Catalog) -> CommitHead | None:
    """The job's commit head; None when nothing was committed since this record exists
    (or it is unreadable or oversized: logged; the next commit replaces it, its `seq`
    starting over at 1).

    :raises StorageError: the store cannot be read (a watcher retries).
    """
    return bounded.read_record_or_warn(catalog.store, COMMITTED, bounded.json_object(CommitHead.from_json),
                                       limits=limits_of(COMMITTED), where=f"{catalog.uri}/{COMMITTED}",
                                       what="commit head")


def record_commit(catalog: Catalog, record: TransactionRecord, detail: Mapping[str, Any], *,
                  landed_before: bool) -> None:
    """Write the commit head after `record` was committed to its sink (`detail`: the sink's
    position, ``version`` for Delta). A transaction that had landed before
    (`landed_before`: a repeated commit step, a recovery) moves the head only when the
    head is behind its batch, so a repeated commit is not reported twice. Never raises."""
    try:
        head = read_commit_head(catalog)
        if landed_before and head is not None and head.batch >= record.batch_id:
            return
        version = detail.get("version")
        new = CommitHead(
            seq=(head.seq if head is not None else 0) + 1, job=catalog.job, batch=record.batch_id,
            generation=record.generation, txn_id=record.txn_id, sink_id=record.sink_id,
            sink_version=version if isinstance(version, int) and not isinstance(version, bool) else None,
            committed_at=time.time(),
        )
        catalog.store.put(COMMITTED, json.dumps(new.to_json(), sort_keys=True).encode())
    except (StorageError, OSError) as exc:  # a notification: the commit itself landed
        log.warning("could not record the commit of %s in %s/%s (asset watchers see it "
                    "with the next commit): %s",
                    record.txn_id, catalog.uri, COMMITTED, exc)
