"""Fake sinks shared by tests: one home, so that one class registers each fake kind
(a test module imported under two names registered a second class for the kind, and
the commit step rebuilt the other one; an order-dependent failure).

`FakeSink` keeps its destination in a class-level dict by name (`VersionedSink` adds a
table version to its commits, `LocatedSink` a location); `RecordingSink` remembers per
instance what was committed (`recording_record` is its pre-commit record);
`RecordingLineageSink` and `AbortRecordingSink` remember in class-level lists, for a
commit step that rebuilds them from a record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext
from tests.support.records import transaction_record

__all__ = ["AbortRecordingSink", "FakeSink", "LocatedSink", "RecordingLineageSink", "RecordingSink", "ReplayRecordSink", "VersionedSink",
           "recording_record"]


class FakeSink(Sink):
    """Keeps its "destination" in a class-level dict keyed by `name`."""

    kind = "test-fake"
    worlds: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.options: dict[str, Any] = {}
        self.world = FakeSink.worlds.setdefault(
            name, {"committed": {}, "aborted": [], "calls": [], "fail": {}, "configured": []}
        )

    @property
    def sink_id(self) -> str:
        return f"fake://{self.name}"

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name}

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        self.options = dict(storage_options)
        self.world["configured"].append(dict(storage_options))

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:  # pragma: no cover - not used
        return {}

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        self.world["calls"].append(("commit", record.txn_id))
        failure = self.world["fail"].get(record.txn_id)
        if failure is not None:
            raise failure
        if record.batch_id in self.world["committed"]:
            assert self.world["committed"][record.batch_id] == record.txn_id, "duplicate batch"
            return CommitOutcome(record.txn_id, "already")
        self.world["committed"][record.batch_id] = record.txn_id
        return CommitOutcome(record.txn_id, "committed")

    def is_committed(self, record: TransactionRecord) -> bool:
        self.world["calls"].append(("is_committed", record.txn_id))
        return self.world["committed"].get(record.batch_id) == record.txn_id

    def abort(self, record: TransactionRecord) -> None:
        self.world["calls"].append(("abort", record.txn_id))
        assert not self.is_committed(record)
        self.world["aborted"].append(record.txn_id)

    def committed_position(self, job: str) -> int | None:
        return max(self.world["committed"], default=None)


class VersionedSink(FakeSink):
    """A FakeSink whose commits report a table version, as DeltaSink's do."""

    kind = "test-versioned"

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        outcome = super().commit(record)
        return CommitOutcome(outcome.txn_id, outcome.status, {"version": 100 + record.batch_id})


class LocatedSink(VersionedSink):
    """A VersionedSink that names a location, so its output has an asset."""

    kind = "test-located"

    @property
    def location_uri(self) -> str:
        return f"file:///fake-sinks/{self.name}"


class RecordingSink(Sink):
    """Remembers what was committed and aborted; commits are idempotent like a real sink."""

    kind = "recording-test"

    def __init__(self, name: str = "rec") -> None:
        self.name = name
        self.committed: dict[int, int] = {}  # batch -> generation
        self.aborted: list[tuple[int, int]] = []

    @property
    def sink_id(self) -> str:
        return f"recording:{self.name}"

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name}

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:
        return {"rows": 1}

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        if record.batch_id in self.committed:
            return CommitOutcome(record.txn_id, "already")
        self.committed[record.batch_id] = record.generation
        return CommitOutcome(record.txn_id, "committed", {"version": record.batch_id})

    def is_committed(self, record: TransactionRecord) -> bool:
        return self.committed.get(record.batch_id) == record.generation

    def abort(self, record: TransactionRecord) -> None:
        self.aborted.append((record.batch_id, record.generation))

    def committed_position(self, job: str) -> int | None:
        return max(self.committed, default=None)


def recording_record(batch: int, generation: int, job: str = "job") -> TransactionRecord:
    """The pre-commit record of the default `RecordingSink` for `batch` by `generation`."""
    return transaction_record("recording-test", batch, generation, {"rows": 1}, job=job, sink_id="recording:rec",
                              created_at=0.0)


class RecordingLineageSink(Sink):
    """A recording sink the commit step can rebuild from a record (`sink_from_config`)."""

    kind = "recording-lineage"
    committed_log: ClassVar[list[tuple[int, int]]] = []
    aborted: ClassVar[list[tuple[int, int]]] = []

    def __init__(self, **_: Any) -> None:
        pass

    @property
    def sink_id(self) -> str:
        return "recording"

    def to_config(self) -> dict[str, Any]:
        return {}

    def stage(self, df: Any, ctx: Any) -> dict[str, Any]:
        return {}

    def commit(self, rec: TransactionRecord) -> CommitOutcome:
        self.committed_log.append((rec.batch_id, rec.generation))
        return CommitOutcome(rec.txn_id, "committed")

    def is_committed(self, rec: TransactionRecord) -> bool:
        return (rec.batch_id, rec.generation) in self.committed_log

    def abort(self, rec: TransactionRecord) -> None:
        self.aborted.append((rec.batch_id, rec.generation))

    def committed_position(self, job: str) -> int | None:
        return None


class AbortRecordingSink(Sink):
    """Nothing ever committed; remembers what it aborted."""

    kind = "cli-abort-test"
    aborted: ClassVar[list[str]] = []

    sink_id = "cli-test"

    def to_config(self) -> dict[str, Any]:
        return {}

    def stage(self, df: Any, ctx: Any) -> dict[str, Any]:  # pragma: no cover - not used
        return {}

    def commit(self, record: TransactionRecord) -> CommitOutcome:  # pragma: no cover - not used
        raise AssertionError("abort-generation must not commit")

    def is_committed(self, record: TransactionRecord) -> bool:
        return False

    def abort(self, record: TransactionRecord) -> None:
        self.aborted.append(record.txn_id)

    def committed_position(self, job: str) -> int | None:
        return None


class ReplayRecordSink:
    """A sink as replay reads it: only its committed replay records (`records[batch]`)."""

    can_rewind = False  # as `Sink` declares (the sink-ahead refusal reads it)

    def __init__(self, records: dict[int, str | None], sink_id: str = "fake:blue") -> None:
        self.records = records
        self.sink_id = sink_id

    def replay_record(self, job: str, batch_id: int) -> str | None:
        return self.records.get(batch_id)
