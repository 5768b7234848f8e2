"""Fake sinks shared by tests: one home, so that one class registers each fake kind
(a test module imported under two names registered a second class for the kind, and
the commit step rebuilt the other one; an order-dependent failure).

One family: `FakeSinkBase` implements the parts of the sink protocol no fake varies (a
name, the id and config built from it, what a stage returns) as a sink that never
commits; each variant adds one behaviour. `FakeSink` keeps its destination in a
class-level dict by name (`VersionedSink` adds a table version to its commits,
`LocatedSink` a location, `PositionedSink` a fixed committed position); `RecordingSink`
remembers per instance what was committed (`recording_record` is its pre-commit record;
`ClaimingSink` refuses a batch another generation holds, `RewindingSink` can be
rewound); `RecordingLineageSink` and `AbortRecordingSink` remember in class-level lists,
for a commit step that rebuilds them from a record; `ReplayRecordSink` serves committed
replay records (`PositionedReplaySink` adds its committed position). `CopySink` is a
small real `FileSink` over one `Storage`, for the claim protocol's tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import ObjectNotFound, SinkError, TransactionConflict
from airflow_sparkpoint.sinks import _claims as claims
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext
from airflow_sparkpoint.storage import Storage
from tests.support.records import transaction_record

__all__ = ["COPY_FILES", "AbortRecordingSink", "ClaimingSink", "CopySink", "FakeSink", "FakeSinkBase",
           "LocatedSink", "PositionedReplaySink", "PositionedSink", "RecordingLineageSink", "RecordingSink",
           "ReplayRecordSink", "RewindingSink", "VersionedSink", "recording_record"]


class FakeSinkBase(Sink):
    """The parts of the sink protocol no fake varies, as a sink that never commits: its id
    is `id_format` filled with its `name`, its config the name (`named`; a commit step
    rebuilds it from that) or nothing, a stage returns `stages`; nothing is committed,
    an abort does nothing. A variant sets its own `kind` to be rebuilt from a record (one
    that inherits its kind is not registered) and overrides the behaviour it is about."""

    id_format: ClassVar[str] = "fake://{name}"
    named: ClassVar[bool] = True
    stages: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, name: str = "") -> None:
        self.name = name

    @property
    def sink_id(self) -> str:
        return self.id_format.format(name=self.name)

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name} if self.named else {}

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:
        return dict(self.stages)

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        raise AssertionError(f"{type(self).__name__} must not commit")

    def is_committed(self, record: TransactionRecord) -> bool:
        return False

    def abort(self, record: TransactionRecord) -> None:
        pass

    def committed_position(self, job: str) -> int | None:
        return None


class FakeSink(FakeSinkBase):
    """Keeps its "destination" in a class-level dict keyed by `name`."""

    kind = "test-fake"
    worlds: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.options: dict[str, Any] = {}
        self.world = FakeSink.worlds.setdefault(
            name, {"committed": {}, "aborted": [], "calls": [], "fail": {}, "configured": []}
        )

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        self.options = dict(storage_options)
        self.world["configured"].append(dict(storage_options))

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


class PositionedSink(FakeSink):
    """A FakeSink that says it committed through `position`, whatever its world holds (a
    sink ahead of, or behind, the job's checkpoints). Rebuilt from a record, it is a
    plain FakeSink."""

    def __init__(self, name: str, position: int) -> None:
        super().__init__(name)
        self.position = position

    def committed_position(self, job: str) -> int | None:
        return self.position


class RecordingSink(FakeSinkBase):
    """Remembers what was committed and aborted; commits are idempotent like a real sink."""

    kind = "recording-test"
    id_format = "recording:{name}"
    stages: ClassVar[Mapping[str, Any]] = {"rows": 1}

    def __init__(self, name: str = "rec") -> None:
        super().__init__(name)
        self.committed: dict[int, int] = {}  # batch -> generation
        self.aborted: list[tuple[int, int]] = []

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
    return transaction_record("recording-test", batch, generation, {"rows": 1}, job=job,
                              sink_id="recording:rec", created_at=0.0)


class ClaimingSink(RecordingSink):
    """Exclusive promotion: a batch another generation holds refuses the commit."""

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        holder = self.committed.get(record.batch_id)
        if holder is not None and holder != record.generation:
            raise TransactionConflict(f"batch {record.batch_id} is held by transaction "
                                      f"job-b{record.batch_id}-g{holder}")
        return super().commit(record)


class RewindingSink(RecordingSink):
    """A RecordingSink that declares it can rewind; `rewound`: the batches of the
    snapshots it was rewound to (nothing committed is removed)."""

    can_rewind = True

    def __init__(self, name: str = "rec") -> None:
        super().__init__(name)
        self.rewound: list[int] = []

    def rewind(self, job: str, snapshot: SnapshotMetadata) -> None:
        self.rewound.append(snapshot.batch_id)


class RecordingLineageSink(FakeSinkBase):
    """A recording sink the commit step can rebuild from a record (`sink_from_config`)."""

    kind = "recording-lineage"
    id_format = "recording"
    named = False
    committed_log: ClassVar[list[tuple[int, int]]] = []
    aborted: ClassVar[list[tuple[int, int]]] = []

    def __init__(self, **_: Any) -> None:
        super().__init__()

    def commit(self, rec: TransactionRecord) -> CommitOutcome:
        self.committed_log.append((rec.batch_id, rec.generation))
        return CommitOutcome(rec.txn_id, "committed")

    def is_committed(self, rec: TransactionRecord) -> bool:
        return (rec.batch_id, rec.generation) in self.committed_log

    def abort(self, rec: TransactionRecord) -> None:
        self.aborted.append((rec.batch_id, rec.generation))


class AbortRecordingSink(FakeSinkBase):
    """Nothing ever committed (a commit is an error); remembers what it aborted."""

    kind = "cli-abort-test"
    id_format = "cli-test"
    named = False
    aborted: ClassVar[list[str]] = []

    def abort(self, record: TransactionRecord) -> None:
        self.aborted.append(record.txn_id)


class ReplayRecordSink(FakeSinkBase):
    """A sink as replay reads it: only its committed replay records (`records[batch]`)."""

    id_format = "{name}"

    def __init__(self, records: dict[int, str | None], sink_id: str = "fake:blue") -> None:
        super().__init__(sink_id)
        self.records = records

    def replay_record(self, job: str, batch_id: int) -> str | None:
        return self.records.get(batch_id)


class PositionedReplaySink(ReplayRecordSink):
    """A `ReplayRecordSink` that committed every batch it holds a record for: its committed
    position is the newest of them (what the sink-ahead check compares with)."""

    def committed_position(self, job: str) -> int | None:
        return max(self.records)


#: files `CopySink.stage_batch` stages per batch by default
COPY_FILES = 3


class CopySink(claims.FileSink):
    """A file sink over one `Storage`: staged objects under ``_staging/<txn>/`` are copied
    to ``part-<txn>-<n>`` on promotion, the way `DirectorySink` promotes on S3. `hook(step)`
    runs at each step of a promotion so a test can stop a claimant there (it raises to
    "die"). Batches are staged by `stage_batch`, not from a DataFrame."""

    kind = "copy-test"
    format = "bin"
    job = "orders"  # the job of the batches it stages

    def __init__(self, store: Storage, hook: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.uri = store.uri
        self.hook = hook or (lambda step: None)
        self._options = {}
        self._store = store

    def to_config(self) -> dict[str, Any]:
        return {}

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:  # pragma: no cover - not used
        raise AssertionError("CopySink stages with stage_batch")

    def stage_batch(self, batch: int, generation: int, files: int = COPY_FILES) -> TransactionRecord:
        """Stage `files` objects of `batch` by `generation`; their pre-commit record."""
        txn = f"{self.job}-b{batch}-g{generation}"
        staged = []
        for i in range(files):
            key = f"_staging/{txn}/{i}"
            self.store.put(key, f"{txn}:{i}".encode())
            staged.append({"src": key, "dst": f"part-{txn}-{i:05d}", "size": len(f"{txn}:{i}")})
        return transaction_record(self, batch, generation, {"files": staged}, job=self.job)

    def _storage(self) -> Storage:
        return self.store

    def _file_uri(self, file: Mapping[str, Any]) -> str:
        return f"{self.uri.rstrip('/')}/{file['path']}"

    def _plan(self, record: TransactionRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        staged = record.payload["staged"]["files"]
        return {"moves": staged}, [{"path": f["dst"], "size": f["size"]} for f in staged]

    def _missing(self, txn: str, plan: Mapping[str, Any]) -> list[str]:
        return [m["src"] for m in plan["moves"] if not self.store.exists(m["src"])
                and not self.store.exists(m["dst"])]

    def _promote(self, claim: Mapping[str, Any]) -> list[str]:
        states = []
        for done, move in enumerate(claim["plan"]["moves"], start=1):
            try:
                self.store.copy(move["src"], move["dst"])
                states.append("copied")
            except ObjectNotFound:
                if not self.store.exists(move["dst"]):
                    raise SinkError(
                        f"staged {move['src']} is gone and {move['dst']} is not in place: lost") from None
                states.append("already")
            self.hook(f"promoted {done}")
        return states

    def _discard(self, txn: str, plan: Mapping[str, Any] | None, *, promoted_too: bool) -> int:
        removed = self.store.delete_prefix(f"_staging/{txn}")
        if promoted_too:
            self.store.delete(info.key for info in self.store.list() if info.key.startswith(f"part-{txn}-"))
        return removed

    def _after_done(self, claim: Mapping[str, Any]) -> None:
        self.store.delete_prefix(f"_staging/{claim['txn_id']}")

    # what a test looks at
    def visible(self) -> list[str]:
        return sorted(i.key for i in self.store.list() if i.key.startswith("part-"))

    def staged(self) -> list[str]:
        return sorted(i.key for i in self.store.list("_staging"))

    def commit(self, record: TransactionRecord) -> Any:
        return claims.commit(self, record)

    def abort(self, record: TransactionRecord) -> None:
        claims.abort(self, record)
