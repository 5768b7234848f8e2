"""Lifetime checkpoint counters of a job: one small record, updated where the events happen.

Flink's ``numberOfCompletedCheckpoints`` / ``numberOfFailedCheckpoints`` /
``numberOfRestoredCheckpoints`` count every checkpoint ever, but the store keeps only the
retained ones: counting them would undercount, and counting from the beginning would cost
O(all batches ever). So the running generation keeps ``<job>/checkpoint-counters.json``::

    {"schema_version": 1, "completed": 412, "failed": 3, "restored": 7,
     "recent": [[1795307061.1, true], [1795307064.9, false], ...],   # last RECENT_LIMIT attempts
     "trend": [[412, 880, 1795307061.1, 734, 20931, 5120044], ...],  # last TREND_LIMIT checkpoints
     "generation": 9, "updated_at": 1795307064.9}

``trend`` is the rolling history the UI charts (`CheckpointPoint`: id, batch, completed
at, duration ms, bytes copied, bytes total), oldest first; it carries over restarts and
restores like the counts (each generation appends to its base), so the record stays
bounded (``layout.RECORD_MAX_BYTES``) whatever the job's age.

Only the current generation writes it (invariant 5 fences the others out of checkpointing),
as *its base + its own counts*, so every write is idempotent. A write failure is logged and
never fails the job: these are metrics. Under a generation switch a count in flight may be
lost (the new generation read its base before the old one's last write); never doubled.

Pure Python over a `Catalog`: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import bounded
from airflow_sparkpoint.checkpoints.layout import COUNTERS, limits_of
from airflow_sparkpoint.exceptions import StorageError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["COUNTERS", "RECENT_LIMIT", "SCHEMA_VERSION", "TREND_LIMIT", "CheckpointCounters",
           "CheckpointPoint", "CounterRecorder", "read_counters"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: how many of the newest checkpoint attempts the record remembers (failure ratio windows)
RECENT_LIMIT = 100
#: how many of the newest completed checkpoints the trend keeps (~40 KiB of JSON)
TREND_LIMIT = 500


@dataclass(frozen=True)
class CheckpointPoint:
    """One completed checkpoint in the trend: what the UI charts over time."""

    id: int
    batch_id: int
    completed_at: float
    duration_ms: int
    bytes_copied: int
    bytes_total: int

    def to_json(self) -> list[float | int]:
        return [self.id, self.batch_id, self.completed_at, self.duration_ms, self.bytes_copied,
                self.bytes_total]

    def as_dict(self) -> dict[str, float | int]:
        """The point with its field names (the UI's JSON)."""
        return {"id": self.id, "batch_id": self.batch_id, "completed_at": self.completed_at,
                "duration_ms": self.duration_ms, "bytes_copied": self.bytes_copied,
                "bytes_total": self.bytes_total}

    @classmethod
    def from_json(cls, data: Any) -> CheckpointPoint:
        """:raises ValueError: not a list of six numbers."""
        if not isinstance(data, (list, tuple)) or len(data) != 6:
            raise ValueError(f"trend point {data!r} is not [id, batch, completed_at, "
                             "duration_ms, copied, total]")
        cid, batch, at, duration, copied, total = data
        return cls(int(cid), int(batch), float(at), int(duration), int(copied), int(total))


@dataclass(frozen=True)
class CheckpointCounters:
    """Lifetime counts and the outcomes of the newest attempts (oldest first)."""

    completed: int = 0
    failed: int = 0
    restored: int = 0
    recent: tuple[tuple[float, bool], ...] = ()
    generation: int = 0
    updated_at: float = 0.0
    trend: tuple[CheckpointPoint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "completed": self.completed,
            "failed": self.failed,
            "restored": self.restored,
            "recent": [[at, ok] for at, ok in self.recent],
            "trend": [point.to_json() for point in self.trend],
            "generation": self.generation,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointCounters:
        """:raises ValueError: malformed, or of a newer schema version."""
        version = data.get("schema_version", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"counters record has schema_version {version!r}; this release "
                             f"reads <= {SCHEMA_VERSION}")
        try:
            recent = tuple((float(at), bool(ok)) for at, ok in data.get("recent", []))
            trend = tuple(CheckpointPoint.from_json(point) for point in data.get("trend", []))
            return cls(
                completed=int(data.get("completed", 0)),
                failed=int(data.get("failed", 0)),
                restored=int(data.get("restored", 0)),
                recent=recent[-RECENT_LIMIT:],
                generation=int(data.get("generation", 0)),
                updated_at=float(data.get("updated_at", 0.0)),
                trend=trend[-TREND_LIMIT:],
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"counters record is malformed ({exc.__class__.__name__}: {exc})") from None

    def failure_ratio(self, window: int) -> tuple[float | None, int]:
        """(failed / attempts over the newest `window` attempts, attempts counted);
        ``(None, 0)`` when nothing was attempted."""
        last = self.recent[-window:] if window > 0 else ()
        if not last:
            return None, 0
        return sum(1 for _, ok in last if not ok) / len(last), len(last)


def read_counters(catalog: Catalog) -> CheckpointCounters | None:
    """The job's counters record; None when there is none (a job of an earlier release,
    or one that never checkpointed) or it is unreadable (logged)."""
    return bounded.read_record_or_warn(catalog.store, COUNTERS,
                                       bounded.json_object(CheckpointCounters.from_json),
                                       limits=limits_of(COUNTERS), where=f"{catalog.uri}/{COUNTERS}",
                                       what="counters record", unreachable=True)


class CounterRecorder:
    """The running generation's side: `completed`, `failed`, `restored` as they happen.

    The base (what earlier generations counted) is read at the first event, so a record
    an older generation wrote while this one was starting up is included.
    """

    def __init__(self, catalog: Catalog, generation: int) -> None:
        self.catalog = catalog
        self.generation = generation
        self._base: CheckpointCounters | None = None
        self._completed = 0
        self._failed = 0
        self._restored = 0
        self._recent: list[tuple[float, bool]] = []
        self._trend: list[CheckpointPoint] = []
        self._lock = threading.RLock()

    def completed(self, at: float | None = None, point: CheckpointPoint | None = None) -> None:
        """Count a completed checkpoint (at `at`); `point` adds it to the trend."""
        with self._lock:
            if point is not None:
                self._trend.append(point)
                del self._trend[:-TREND_LIMIT]
            self._record(at, ok=True)

    def failed(self, at: float | None = None) -> None:
        self._record(at, ok=False)

    def restored(self) -> None:
        with self._lock:
            self._restored += 1
            self._write()

    def _record(self, at: float | None, *, ok: bool) -> None:
        with self._lock:
            if ok:
                self._completed += 1
            else:
                self._failed += 1
            self._recent.append((time.time() if at is None else float(at), ok))
            del self._recent[:-RECENT_LIMIT]
            self._write()

    def _write(self) -> None:
        try:
            if self._base is None:
                self._base = read_counters(self.catalog) or CheckpointCounters()
            base = self._base
            record = CheckpointCounters(
                completed=base.completed + self._completed,
                failed=base.failed + self._failed,
                restored=base.restored + self._restored,
                recent=(*base.recent, *self._recent)[-RECENT_LIMIT:],
                generation=self.generation,
                updated_at=time.time(),
                trend=(*base.trend, *self._trend)[-TREND_LIMIT:],
            )
            self.catalog.store.put(COUNTERS, json.dumps(record.to_json(), sort_keys=True).encode())
        except (StorageError, OSError) as exc:  # metrics never fail the job
            log.warning("could not update the checkpoint counters of job %r: %s", self.catalog.job, exc)
