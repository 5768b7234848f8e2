"""Dispose of a savepoint or checkpoint by hand, or of old savepoints by age or count
(`sparkpoint dispose`). The rules of what savepoint retention keeps are
`retention.savepoint_history_retention`'s; `dispose_savepoints` also says why each
savepoint left was kept. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.retention import relied_on_savepoints, savepoint_history_retention
from airflow_sparkpoint.exceptions import CatalogError, SparkpointError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry

log = logging.getLogger(__name__)

__all__ = ["SavepointDisposal", "dispose_savepoints", "dispose_snapshot"]


def dispose_snapshot(catalog: Catalog, path: str) -> tuple[str, int]:
    """Delete the savepoint or checkpoint `path` (its URI, path or key) of `catalog`'s
    job; return its URI and the number of objects deleted.

    A disposal by path is on purpose: a savepoint the job relies on
    (`retention.relied_on_savepoints`: the newest lineage's origin, blue's final
    savepoint of a cutover while a rollback of green returns there) goes too, with a
    warning naming what it was kept for (without S, a rollback of green returns to
    green's own checkpoint).

    :raises RestoreError: `path` is outside the job, or no snapshot directory of it.
    :raises CatalogError: nothing is there to dispose of.
    """
    key = catalog.key_of(path)
    why = _relied_on_because(catalog, key)
    count = catalog.dispose(path)
    uri = f"{catalog.uri}/{key}"
    if count == 0:
        raise CatalogError(f"nothing to dispose at {uri}: no such checkpoint or "
                           "savepoint (see `sparkpoint list`)")
    if why is not None:
        log.warning("disposed %s by hand, which savepoint retention keeps (%s)", uri, why)
    return uri, count


def _relied_on_because(catalog: Catalog, key: str) -> str | None:
    """Why savepoint retention would keep the savepoint at `key`, or None (not a valid
    savepoint, not relied on, or the records that say so are unreadable: only a warning
    depends on it)."""
    folder, _, name = key.partition("/")
    if folder != layout.SAVEPOINTS or not name or "/" in name:
        return None  # a checkpoint (or no snapshot: `dispose` refuses it)
    try:
        entry = catalog.snapshot_store.savepoint_entry(name)
        return relied_on_savepoints(catalog, [entry]).get(key) if entry is not None else None
    except SparkpointError as exc:
        log.warning("could not tell whether %s/%s is a savepoint the job relies on: %s", catalog.uri, key,
                    exc)
        return None


@dataclass(frozen=True)
class SavepointDisposal:
    """What `dispose_savepoints` did: the URIs `disposed` of (newest first), the
    savepoints `kept` (as listed), and why each was kept (`reasons`: URI and why, the
    newest valid first, then the incomplete or invalid ones)."""

    disposed: list[str]
    kept: list[str]
    reasons: list[tuple[str, str]]


def dispose_savepoints(catalog: Catalog, *, keep: int | None,
                       older_than_s: float | None) -> SavepointDisposal:
    """Dispose of the savepoints of `catalog`'s job beyond the `keep` newest or older than
    `older_than_s` (the newest, and those the job relies on, are kept:
    `retention.savepoint_history_retention`).

    :raises ConfigError: a limit is not a positive number.
    :raises CutoverError: a cutover's plan is unreadable; nothing was disposed.
    :raises StorageError: the store cannot be read or written.
    """
    disposed = savepoint_history_retention(catalog, max_count=keep, max_age_s=older_than_s)
    entries = catalog.list_savepoints()
    return SavepointDisposal(disposed, [entry.uri for entry in entries],
                             [(entry.uri, why) for entry, why in _why_kept(catalog, entries)])


def _why_kept(catalog: Catalog, entries: list[SnapshotEntry]) -> list[tuple[SnapshotEntry, str]]:
    """Each savepoint retention left, newest first, with why (the rules of
    `retention.savepoint_history_retention`)."""
    valid = sorted((e for e in entries if e.metadata is not None),
                   key=lambda e: (e.metadata.created_at if e.metadata else 0.0, e.id), reverse=True)
    relied_on = relied_on_savepoints(catalog, valid)
    reasons = []
    for index, entry in enumerate(valid):
        if index == 0:
            why = "the newest"
        elif entry.key in relied_on:
            why = relied_on[entry.key]
        else:
            why = "within the limits"
        reasons.append((entry, why))
    for entry in entries:
        if entry.metadata is None:
            reasons.append((entry,
                            "incomplete, untouched for less than an hour"
                            if "no _metadata" in (entry.error or "")
                            else f"invalid, kept for inspection: {entry.error}"))
    return reasons
