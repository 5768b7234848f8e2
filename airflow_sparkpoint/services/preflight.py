"""The blue-green pre-flight: can green's application read blue's state?

The restore drill (`services/drill.py`) of green's application against blue's newest
completed checkpoint, while blue keeps running, writing nothing of blue's (not even the
verification record). Spark validates a stateful operator's state schema when the
restored query plans its first batch, so a drill that ran no batch proves nothing: the
pre-flight then drills the checkpoint before it (green replays blue's last batch into
scratch sinks). A checkpoint that blue's retention removed while the drill read it is not
green's fault: blue's new newest one is drilled instead (at most `MAX_RETIRED` times).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.services.drill import DrillFailed
from airflow_sparkpoint.storage import open_storage

__all__ = ["MAX_RETIRED", "PreflightPassed", "before", "newest", "run_preflight", "still_there"]

log = logging.getLogger(__name__)

#: checkpoints retired under a running drill before the pre-flight gives up
MAX_RETIRED = 3

#: runs green's application from a snapshot once: the checks and the run result
#: (`DrillFailed`: the application failed or did not finish from it)
Drill = Callable[[SnapshotHandle], tuple[dict[str, Any], dict[str, Any] | None]]


@dataclass(frozen=True)
class PreflightPassed:
    """A passed pre-flight: the checkpoint green restored (`handle`), the drill's `checks`
    and run `result`, every checkpoint drilled (`tried`, with why it went on) and how long
    it took."""

    handle: SnapshotHandle
    checks: dict[str, Any]
    result: dict[str, Any] | None
    tried: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    def summary(self, drill_job: str) -> dict[str, Any]:
        """The pre-flight operator's XCom: ``ok``, ``snapshot``, ``batch_id``, ``drill_job``,
        ``result``, ``tried``."""
        return {"ok": True, "snapshot": self.handle.uri, "batch_id": self.handle.metadata.batch_id,
                "drill_job": drill_job, "result": self.result, "tried": list(self.tried)}


def run_preflight(catalog: Catalog, *, green: str, drill: Drill, storage_options: Mapping[str, Any],
                  info: Callable[..., None] = log.info, warn: Callable[..., None] = log.warning,
                  ) -> PreflightPassed:
    """Drill green's application (`green` names it in messages) from blue's newest completed
    checkpoint of `catalog` until a drill ran a batch: the one before when none ran, blue's
    new newest when retention removed the drilled one (`still_there`, at most `MAX_RETIRED`).

    :raises DrillFailed: blue has no completed checkpoint; green cannot restore the state
        ("pre-flight refused", with the drill's error); or no drill ran a batch, so the
        state was never read ("pre-flight inconclusive").
    """
    started = time.monotonic()
    tried: list[dict[str, Any]] = []
    handle = newest(catalog)
    retired = 0
    while True:
        try:
            checks, result = drill(handle)
        except DrillFailed as exc:
            if not still_there(handle, storage_options) and retired < MAX_RETIRED:
                retired += 1
                tried.append({"snapshot": handle.uri, "outcome": "retired by blue during the drill"})
                warn("blue retired %s while the pre-flight read it; drilling its newest checkpoint again",
                     handle.uri)
                handle = newest(catalog)
                continue
            raise DrillFailed(
                f"pre-flight refused: green ({green}) cannot restore job {catalog.job!r}'s "
                f"checkpoint {handle.uri} (batch {handle.metadata.batch_id}); blue was left running. "
                f"{exc}") from exc
        if result is not None and result.get("batches_processed"):
            break
        tried.append({"snapshot": handle.uri, "outcome": "no batch ran: the state was not read"})
        older = before(catalog, handle)
        if older is None:
            raise DrillFailed(
                f"pre-flight inconclusive: green restored job {catalog.job!r}'s checkpoint {handle.uri} "
                "but ran no batch (no input since it, and no older retained checkpoint to replay from), "
                "so Spark never checked the state against green's operators; retry when input arrived")
        info("no input since %s: drilling the checkpoint before it (%s), so that green replays a batch",
             handle.uri, older.uri)
        handle = older
    tried.append({"snapshot": handle.uri, "outcome": "restored", **checks})
    duration = time.monotonic() - started
    info("pre-flight passed in %.1f s: green restores %s (%s)", duration, handle.uri, checks)
    return PreflightPassed(handle, checks, result, tried, duration)


def newest(catalog: Catalog) -> SnapshotHandle:
    """Blue's newest completed checkpoint.

    :raises DrillFailed: blue has none to drill."""
    latest = catalog.latest()
    if latest is None:
        raise DrillFailed(f"pre-flight: job {catalog.job!r} has no completed checkpoint under "
                          f"{catalog.uri}; expected a running blue (see `sparkpoint list`)")
    return catalog.handle(latest)


def before(catalog: Catalog, handle: SnapshotHandle) -> SnapshotHandle | None:
    """The newest restorable checkpoint older than `handle`, in its lineage (None: none)."""
    for entry in catalog.list_checkpoints():  # newest first
        if entry.restorable and entry.id < handle.metadata.id and entry.metadata is not None:
            return catalog.handle(entry.metadata)
    return None


def still_there(handle: SnapshotHandle, storage_options: Mapping[str, Any]) -> bool:
    """Whether `handle`'s ``_metadata`` is still stored (True when that cannot be told: a
    failure is then blamed on nothing but the drill's own error)."""
    try:
        return open_storage(handle.uri, **storage_options).exists("_metadata")
    except SparkpointError:
        return True
