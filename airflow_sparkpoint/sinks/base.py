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

from airflow_sparkpoint.checkpoints.layout import parse_txn_id, txn_id
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, SinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DRIVER_STAGING_MAX_BYTES", "SETTLE_METHODS", "CommitOutcome", "CommittedTxn", "Sink",
           "StageContext", "check_settler", "checked_bucket", "column_names", "is_orphan", "replay_of",
           "settler"]


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


#: what a commit step calls on a sink it rebuilt from a transaction record: a subclass
#: that overrides one of them cannot be settled by the class registered under its kind
SETTLE_METHODS = ("configure", "commit", "is_committed", "decision", "was_committed", "abort",
                  "committed_position", "rewind",
                  "rewind_problem", "cleanup_orphans", "committed_txn", "replay_record")


class Sink(abc.ABC):
    """A two-phase-commit sink. A class that sets its own `kind` registers under it for
    `sink_from_config`; a subclass that inherits its kind does not (it never replaces
    the class a commit step rebuilds; see `settler`)."""

    kind: ClassVar[str] = ""
    #: whether `rewind` can move the sink back to a snapshot (``restore.sinkAhead=rewind``)
    can_rewind: ClassVar[bool] = False
    _registry: ClassVar[dict[str, type[Sink]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind and "kind" in cls.__dict__:
            Sink._registry[cls.kind] = cls

    @staticmethod
    def registered() -> Mapping[str, type[Sink]]:
        """Every sink class imported so far, by `kind` (`sinks.registry.sink_from_config`)."""
        return dict(Sink._registry)

    @classmethod
    def class_path(cls) -> str:
        """``module.QualName`` of the class (names it in records and messages)."""
        return f"{cls.__module__}.{cls.__qualname__}"

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

    def decision(self, record: TransactionRecord) -> str | None:
        """The decision that stands for the transaction: ``promote`` (it holds its batch's
        commit or will: an abort finishes it instead), ``abort`` (it never will), or None
        (undecided); reads only."""
        return "promote" if self.is_committed(record) else None

    def was_committed(self, record: TransactionRecord) -> bool:
        """Whether the transaction landed at some time, even if a rewind undid it since
        (a sink that cannot rewind: `is_committed`)."""
        return self.is_committed(record)

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

    def rewind_problem(self, job: str, snapshot: SnapshotMetadata) -> str | None:
        """Why `rewind` to `snapshot` cannot succeed (read only; the check before anything
        is written), or None when it can."""
        return None if self.can_rewind else f"{type(self).__name__} cannot be rewound"

    def cleanup_orphans(self, job: str, keep: set[str], *, upto_generation: int | None = None) -> int:
        """Delete staged data of `job` whose transaction id is not in `keep` (`is_orphan`:
        never a generation newer than `upto_generation`, the caller's); return a count."""
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


def is_orphan(txn: str, keep: set[str], upto_generation: int | None) -> bool:
    """Whether staged data of transaction `txn` is the caller's to clean up: not in
    `keep`, and not staged by a generation newer than `upto_generation` (a newer
    generation's staging is never an older one's to settle, whatever it knows: the
    `Fence.admits` rule; a stalled recovery met it in the simulation)."""
    if txn in keep:
        return False
    if upto_generation is not None:
        parsed = parse_txn_id(txn)
        if parsed is not None and parsed[2] > upto_generation:
            return False
    return True


def column_names(owner: str, name: str, value: Any) -> list[str]:
    """A sink argument naming columns (`partition_by`, `keys`): None, one column name or
    a sequence of them, as a list; the same for every sink.

    :raises ConfigError: anything else, or an empty name (the message names `owner`,
        `name` and the value).
    """
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if isinstance(names, (bytes, Mapping)) or not isinstance(names, (list, tuple)) or \
            not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(f"{owner} {name}={value!r} is invalid; expected a column name "
                          "or a list of column names")
    return [str(n) for n in names]


def settler(sink: Sink) -> dict[str, str]:
    """What a transaction record keeps about the class that must settle it:
    ``{"settled_by": "<module.Class>"}`` when `sink` is a subclass of the class
    registered under its kind that overrides a `SETTLE_METHODS` method (a commit step
    that rebuilt the registered class would commit or abort differently), else {} (a
    subclass that only changes staging is settled by its base class, as before)."""
    cls = type(sink)
    registered = Sink.registered().get(cls.kind)
    if registered is None or registered is cls:
        return {}
    if any(getattr(cls, name) is not getattr(registered, name) for name in SETTLE_METHODS):
        return {"settled_by": cls.class_path()}
    return {}


def check_settler(record: TransactionRecord, sink: Sink) -> None:
    """Refuse to settle `record` through `sink` when the record says another class must.

    :raises SinkError: the record was staged by a subclass that settles differently
        (`settler`) and `sink` is not an instance of exactly that class.
    """
    wanted = record.payload.get("settled_by") if isinstance(record.payload, Mapping) else None
    if not isinstance(wanted, str) or wanted == type(sink).class_path():
        return
    raise SinkError(
        f"transaction record {record.txn_id} was staged by sink class {wanted} (kind {record.sink!r}), which "
        f"commits or aborts differently from {type(sink).class_path()}; refused rather than settled by the "
        "wrong class. Declare the job's sink to the commit step "
        "(SparkpointCommitOperator(sink=<an instance of "
        f"{wanted}>)), or give that class its own `kind` and import it where the commit step runs"
    )


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
