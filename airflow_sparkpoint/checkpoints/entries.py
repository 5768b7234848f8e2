"""The records the catalog (`airflow_sparkpoint.checkpoints.catalog`) hands out: a
listed snapshot directory, a readable snapshot, the outcome of a retention pass, a
claimed generation. Below the catalog so that lineage and retention can use them too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.storage import Storage

__all__ = ["GenerationInfo", "RetentionResult", "SnapshotEntry", "SnapshotHandle"]


@dataclass(frozen=True)
class SnapshotEntry:
    """One checkpoint or savepoint directory as seen by a listing: valid or not."""

    kind: str
    id: int
    uri: str
    key: str  # directory key relative to the job root
    metadata: SnapshotMetadata | None = None
    error: str | None = None
    #: the generation whose restore of an older snapshot started a new lineage that
    #: abandoned this checkpoint (invariant 9); None while it is on the current lineage
    superseded_by: int | None = None

    @property
    def valid(self) -> bool:
        return self.metadata is not None

    @property
    def restorable(self) -> bool:
        """Valid and not superseded: what ``restore=latest`` may choose."""
        return self.metadata is not None and self.superseded_by is None


@dataclass(frozen=True)
class SnapshotHandle:
    """A readable snapshot: its metadata and the store its file keys resolve against."""

    uri: str
    metadata: SnapshotMetadata
    files_store: Storage


@dataclass(frozen=True)
class RetentionResult:
    deleted_checkpoints: tuple[int, ...] = ()
    deleted_files: int = 0
    deleted_bytes: int = 0


@dataclass(frozen=True)
class GenerationInfo:
    generation: int
    started_at: float
    host: str = ""
    pid: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)
