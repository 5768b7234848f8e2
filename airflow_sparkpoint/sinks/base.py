"""The two-phase-commit sink protocol (Flink's TwoPhaseCommitSinkFunction, per micro-batch).

Lifecycle of the transaction of batch N in generation g, keyed ``(job, N, g)``:

1. ``stage(df, ctx)`` inside ``foreachBatch``: write the batch's rows somewhere invisible
   to readers and return a JSON payload describing it (the pre-commit record). Safe to
   repeat for the same batch: staging areas are keyed by the transaction id and reset.
2. The runtime stores the record durably (`Catalog.put_transaction`) *before* Spark
   writes ``commits/N``; so a batch Spark considers done always has a record.
3. ``commit(record)`` once the checkpoint covering N is complete: idempotent; "did it
   land?" is answered by reading the sink (`is_committed`), never by assuming.
   Promotion of batch N is exclusive (invariant 8): of two transactions of N (a stalled
   driver and its replacement, two lineages) exactly one commits, whichever generation
   wrote it; the other gets `TransactionConflict` and its own staged data is discarded.
   `committed_txn` tells which one holds N.
4. ``abort(record)`` for transactions that can never be confirmed: deletes staged data.
   A transaction that holds its batch's commit is never aborted (an unfinished
   promotion is finished instead).

Everything except `stage` is pure Python (no JVM), so an Airflow worker can commit.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_sparkpoint.checkpoints.layout import txn_id
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError, InvalidPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


#: default of ``spark.sparkpoint.delta.driverStagingMaxBytes``
DRIVER_STAGING_MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class StageContext:
    """What a sink needs to know to stage one batch."""

    job: str
    batch_id: int
    generation: int
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    #: a batch Spark estimates at no more than this is written from the driver (DeltaSink)
    driver_staging_max_bytes: int = DRIVER_STAGING_MAX_BYTES

    @property
    def txn_id(self) -> str:
        return txn_id(self.job, self.batch_id, self.generation)


@dataclass(frozen=True)
class CommittedTxn:
    """Which transaction holds the commit of batch `batch_id` of `job` in a sink."""

    job: str
    batch_id: int
    generation: int | None  # None when the sink cannot tell (e.g. a commit of an old release)
    txn_id: str | None


@dataclass(frozen=True)
class CommitOutcome:
    """What `commit` did: ``committed`` now, or found ``already`` committed (a no-op)."""

    txn_id: str
    status: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class Sink(abc.ABC):
    """A two-phase-commit sink. Subclasses register under `kind` for `sink_from_config`."""

    kind: ClassVar[str] = ""
    #: whether `rewind` can move the sink back to a snapshot (``restore.sinkAhead=rewind``)
    can_rewind: ClassVar[bool] = False
    _registry: ClassVar[dict[str, type[Sink]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Sink._registry[cls.kind] = cls

    @staticmethod
    def registered() -> Mapping[str, type[Sink]]:
        """Every sink class imported so far, by `kind` (`sinks.kinds.sink_from_config`)."""
        return dict(Sink._registry)

    # -- identity and (de)serialization for external committers -------------------

    @property
    @abc.abstractmethod
    def sink_id(self) -> str:
        """A stable identity of the destination (its URI), used in records and positions."""

    @property
    def location_uri(self) -> str:
        """The destination as a URI with a scheme (``file:///abs/path``, ``s3://bucket/prefix``):
        what Airflow assets and OpenLineage datasets of the sink's output are named after.

        :raises NotImplementedError: the sink names no location (a custom sink that does
            not override it): declare its assets yourself.
        """
        raise NotImplementedError(f"{type(self).__name__} names no location URI; override Sink.location_uri")

    @abc.abstractmethod
    def to_config(self) -> dict[str, Any]:
        """JSON-safe constructor arguments (never credentials) to rebuild this sink."""

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        """Receive connection options (endpoint, region, credentials) at run time."""

    # -- the protocol -------------------------------------------------------------------

    def validate(self) -> None:
        """Check the destination before anything is written (reachable, compatible).

        :raises ConfigError: or `SinkError`, with what is wrong and what is expected.
        """

    @abc.abstractmethod
    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        """Write the batch invisibly; return the pre-commit payload. Must consume `df` fully."""

    @abc.abstractmethod
    def commit(self, record: TransactionRecord) -> CommitOutcome:
        """Make the staged batch visible, exactly once.

        :raises CommitOutcomeUnknown: the outcome could not be determined; keep the data.
        :raises TransactionConflict: another transaction holds the batch; this one's
            staged data was discarded.
        :raises SinkError: the commit certainly failed.
        """

    @abc.abstractmethod
    def is_committed(self, record: TransactionRecord) -> bool:
        """Whether the transaction has landed, read from the sink itself."""

    @abc.abstractmethod
    def abort(self, record: TransactionRecord) -> None:
        """Discard the staged data of a transaction that will never commit (idempotent).

        :raises SinkError: the transaction holds its batch's commit (committed; an
            unfinished promotion of it was finished); it cannot be aborted.
        """

    @abc.abstractmethod
    def committed_position(self, job: str) -> int | None:
        """The highest batch id of `job` committed to this sink, or None (invariant 4)."""

    def rewind(self, job: str, snapshot: SnapshotMetadata) -> None:
        """Move the sink back to its state right after `snapshot`'s batch (only when
        `can_rewind`).

        :raises NotImplementedError: the sink cannot rewind.
        :raises SinkAheadError: the sink cannot be rewound to that point.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot be rewound (restore.sinkAhead=rewind)")

    def cleanup_orphans(self, job: str, keep: set[str]) -> int:
        """Delete staged data of `job` whose transaction id is not in `keep`; return a count."""
        return 0

    def committed_txn(self, job: str, batch_id: int) -> CommittedTxn | None:
        """The transaction that holds the commit of batch `batch_id` of `job`, read from
        the sink itself, or None if the batch has no commit (lineage checks and replay).

        :raises NotImplementedError: the sink cannot tell.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot tell which transaction committed a batch")


    def replay_record(self, job: str, batch_id: int) -> str | None:
        """The replay record (`airflow_sparkpoint.runtime.replay`) that the commit of
        batch `batch_id` of `job` in effect carries, or None: the batch has no commit, its
        commit carries none (an earlier release), or the sink keeps none.

        :raises SinkError: the sink cannot be read.
        """
        return None


def replay_of(record: TransactionRecord) -> str | None:
    """The replay record a transaction's commit must keep (its payload's ``replay``)."""
    replay = record.payload.get("replay") if isinstance(record.payload, Mapping) else None
    return replay if isinstance(replay, str) else None


def checked_bucket(bucket: str, where: str) -> str:
    """`bucket` if it can be an S3 bucket name.

    :raises ConfigError: it cannot; the message starts with `where` (the sink and its URI).
    """
    from airflow_sparkpoint.storage.s3 import validate_bucket_name

    try:
        return validate_bucket_name(bucket)
    except InvalidPath as exc:
        raise ConfigError(f"{where}: {exc}") from None
