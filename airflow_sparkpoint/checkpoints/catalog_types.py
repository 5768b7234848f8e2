"""The records the catalog (`airflow_sparkpoint.checkpoints.catalog`) hands out: a
listed snapshot directory, a readable snapshot, the outcome of a retention pass, a
generation's claim. Below the catalog so that lineage and retention can use them too."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_sparkpoint.checkpoints.layout import SNAPSHOT_LOG_MAX_BYTES
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, SnapshotStats
from airflow_sparkpoint.exceptions import CorruptMetadata
from airflow_sparkpoint.storage import Storage
from airflow_sparkpoint.storage.base import check_size

__all__ = ["GenerationInfo", "RetentionResult", "SnapshotEntry", "SnapshotHandle", "SnapshotSummary",
           "claim_details"]


@dataclass(frozen=True)
class SnapshotSummary:
    """What a listing shows of a valid snapshot: its metadata without the list of its
    files and pending transactions (those are what make a ``_metadata`` big), so that a
    reader of every retained snapshot (`sparkpoint list`, the UI page, a sensor) holds one
    snapshot's files at a time, never all of them."""

    generation: int
    batch_id: int
    created_at: float
    stats: SnapshotStats
    file_count: int
    total_bytes: int
    state_partitions: int | None
    source_checkpoint: int | None

    @classmethod
    def of(cls, meta: SnapshotMetadata) -> SnapshotSummary:
        return cls(meta.generation, meta.batch_id, meta.created_at, meta.stats, len(meta.files),
                   meta.total_bytes, meta.state_partitions, meta.source_checkpoint)


@dataclass(frozen=True)
class SnapshotEntry:
    """One checkpoint or savepoint directory as seen by a listing: valid or not.

    A valid one carries its `metadata`, or, listed for showing only (``slim``), its
    `summary` and no metadata: such an entry is never a restore target."""

    kind: str
    id: int
    uri: str
    key: str  # directory key relative to the job root
    metadata: SnapshotMetadata | None = None
    error: str | None = None
    #: the generation whose restore of an older snapshot started a new lineage that
    #: abandoned this checkpoint (invariant 9); None while it is on the current lineage
    superseded_by: int | None = None
    summary: SnapshotSummary | None = None
    #: the generation an invalid snapshot's ``_metadata`` names, when it parses (a file it
    #: references is missing or the wrong size): tells a fenced writer's late checkpoint
    #: from one of the current lineage's own
    written_by: int | None = None

    @property
    def valid(self) -> bool:
        return self.metadata is not None or self.summary is not None

    @property
    def restorable(self) -> bool:
        """Valid and not superseded: what ``restore=latest`` may choose."""
        return self.valid and self.superseded_by is None

    @property
    def created_at(self) -> float:
        """When a valid snapshot was taken (0.0 for an invalid one: sorts oldest)."""
        if self.metadata is not None:
            return self.metadata.created_at
        return self.summary.created_at if self.summary is not None else 0.0

    def slim(self) -> SnapshotEntry:
        """This entry with its metadata replaced by its `summary`."""
        if self.metadata is None:
            return self
        return replace(self, metadata=None, summary=SnapshotSummary.of(self.metadata))


@dataclass(frozen=True)
class SnapshotHandle:
    """A readable snapshot: its metadata and the store its file keys resolve against."""

    uri: str
    metadata: SnapshotMetadata
    files_store: Storage

    def read_log(self, path: str) -> bytes | None:
        """The bytes of the snapshot's file at `path` (in Spark's checkpoint location: an
        offset or commit log entry), read whole only within
        `layout.SNAPSHOT_LOG_MAX_BYTES`; None when the snapshot holds no such file.

        :raises ObjectTooLarge: the file is recorded or stored larger (the snapshot is
            corrupt; whoever can write the store could plant a file of any size).
        :raises StorageError: it cannot be read.
        """
        ref = next((f for f in self.metadata.files if f.path == path), None)
        if ref is None:
            return None
        check_size(ref.size, SNAPSHOT_LOG_MAX_BYTES, f"{self.uri}: {path} ({ref.key})")
        return self.files_store.get(ref.key, SNAPSHOT_LOG_MAX_BYTES)


@dataclass(frozen=True)
class RetentionResult:
    deleted_checkpoints: tuple[int, ...] = ()
    deleted_files: int = 0
    deleted_bytes: int = 0


@dataclass(frozen=True)
class GenerationInfo:
    """A generation's claim (``generations/<g>``), as its driver wrote it when it started.

    The one type of that record: `Catalog.claim_generation` writes it (`to_json`), and
    every reader (the history model, the submit operator finding its run, the CLI and the
    UI through the history) parses it with `from_json`. `details` is what the driver
    recorded about itself (`claim_details`); the properties read its well-known fields.
    """

    generation: int
    started_at: float
    host: str = ""
    pid: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def app(self) -> str:
        """The Spark application id ("" when not recorded)."""
        return _text(self.details.get("app"))

    @property
    def ui(self) -> str:
        """The Spark UI URL ("" when the UI is off or not recorded)."""
        return _text(self.details.get("ui"))

    @property
    def submitter(self) -> str:
        """The token of the submit that started the run ("" when not started by one)."""
        return _text(self.details.get("submitter"))

    @property
    def restore(self) -> str | None:
        """The ``restore`` setting the run started with."""
        value = self.details.get("restore")
        return None if value is None else str(value)

    @property
    def plan(self) -> str | None:
        """The description of the restore plan the run started from."""
        value = self.details.get("plan")
        return None if value is None else str(value)

    @property
    def config(self) -> Mapping[str, Any]:
        """The settings in force (`records.generation_details`); empty when not recorded."""
        value = self.details.get("config")
        return value if isinstance(value, Mapping) else {}

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "started_at": self.started_at, "host": self.host,
                "pid": self.pid, "details": dict(self.details)}

    @classmethod
    def from_json(cls, data: Any, generation: int | None = None) -> GenerationInfo:
        """Parse a claim; `generation`, when given, is the one its key names.

        :raises CorruptMetadata: `data` is not a claim object, a field has the wrong type,
            or it names another generation than its key.
        """
        if not isinstance(data, Mapping):
            raise CorruptMetadata(f"generation claim {data!r:.80} is not a JSON object")
        number, started = data.get("generation"), data.get("started_at")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise CorruptMetadata(f"generation claim names generation {number!r}; "
                                  "expected a positive integer")
        if generation is not None and number != generation:
            raise CorruptMetadata(f"the claim of generation {generation} names generation {number}")
        if not isinstance(started, (int, float)) or isinstance(started, bool) or not math.isfinite(started):
            raise CorruptMetadata(f"generation {number} claim has started_at {started!r}; "
                                  "expected seconds since the epoch")
        host, pid, details = data.get("host", ""), data.get("pid", 0), data.get("details", {})
        if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool) \
                or not isinstance(details, Mapping):
            raise CorruptMetadata(f"generation {number} claim has host {host!r:.80}, "
                                  f"pid {pid!r:.80}, details "
                                  f"{type(details).__name__}; expected a string, an integer and an object")
        return cls(number, float(started), host, pid, dict(details))


def claim_details(*, restore: str, plan: str, app: str, submitter: str, ui: str | None,
                  **more: Any) -> dict[str, Any]:
    """The `GenerationInfo.details` a starting driver records (the names its properties read)."""
    return {"restore": restore, "plan": plan, "app": app, "submitter": submitter, "ui": ui, **more}


def _text(value: Any) -> str:
    return str(value) if value else ""
