"""The lineage read model of one job: its checkpoints as listed, each marked superseded
when its lineage was abandoned, and what ``restore=latest`` resumes from (invariant 9).

It reads the snapshot store (which checkpoints are complete, invariant 1) and the origin
records (which lineage is current); the rules over them are `checkpoints.lineage`'s.
Pure Python over a `Storage`: no Spark, no Airflow.
"""

from __future__ import annotations

import logging

from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry
from airflow_sparkpoint.checkpoints.lineage import (
    RestartPoint,
    mark_superseded,
    resolve_restart_point,
    superseded_by,
)
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.origins import OriginStore
from airflow_sparkpoint.checkpoints.snapshot_store import SnapshotStore

__all__ = ["LineageView"]

log = logging.getLogger(__name__)


class LineageView:
    """The checkpoints of `snapshots` as the lineages in `origins` make them restorable."""

    def __init__(self, snapshots: SnapshotStore, origins: OriginStore) -> None:
        self.snapshots = snapshots
        self.origins = origins

    def list_checkpoints(self, *, slim: bool = False) -> list[SnapshotEntry]:
        """Every ``chk-*`` directory, newest first, each valid or with the reason it is not;
        valid ones on an abandoned lineage carry ``superseded_by`` (invariant 9). `slim`:
        each with its summary instead of its metadata (`SnapshotEntry.slim`), for readers
        that show them: one snapshot's files are held at a time."""
        ids = self.snapshots.checkpoint_ids()
        if not ids:
            return []
        present = self.snapshots.shared_sizes()
        if not slim:
            entries = [self.snapshots.checkpoint_entry(cid, present) for cid in reversed(ids)]
            return mark_superseded(entries, self.origins.read())
        origins = self.origins.read()  # before: each entry is marked, then slimmed, as it is read
        return [mark_superseded([self.snapshots.checkpoint_entry(cid, present)], origins)[0].slim()
                for cid in reversed(ids)]

    def checkpoints(self) -> list[SnapshotMetadata]:
        """Valid, complete checkpoints, newest first; invalid ones are logged and skipped."""
        result = []
        for entry in self.list_checkpoints():
            if entry.metadata is not None:
                result.append(entry.metadata)
            elif entry.error and "no _metadata" not in entry.error:
                log.warning("skipping invalid checkpoint %s: %s", entry.uri, entry.error)
        return result

    def latest(self) -> SnapshotMetadata | None:
        """The newest valid, complete checkpoint that is not superseded (invariant 9), or None.

        What the sensors, savepoints-from-checkpoint and a retry's restore choice use; the
        external commit step confirms against the snapshot the newest lineage stands at
        instead (`services.commit`), which this is not always: a fenced writer's late
        checkpoint on an id retention freed is not superseded once the origin that
        superseded it is pruned, and a lineage started from a savepoint stands at the
        savepoint. Validates newest-first and stops at the first restorable one, so the cost grows
        with the number of retained checkpoints (and generations), not with every file
        ever written. ``restore=latest`` uses `restart_point`, which may also answer a
        lineage's savepoint or empty state.
        """
        ids = self.snapshots.checkpoint_ids()
        if not ids:
            return None
        origins = self.origins.read()
        present = self.snapshots.shared_sizes()
        for cid in reversed(ids):
            entry = self.snapshots.checkpoint_entry(cid, present)
            if entry.metadata is not None:
                if superseded_by(entry.metadata.generation, cid, origins) is None:
                    return entry.metadata
            elif entry.error and "no _metadata" not in entry.error:
                log.warning("skipping invalid checkpoint %s: %s; falling back to an older one", entry.uri,
                            entry.error)
        return None

    def restart_point(self) -> RestartPoint:
        """What ``restore=latest`` resumes from (see `airflow_sparkpoint.checkpoints.lineage`).

        :raises RestoreError: complete checkpoints exist but none is restorable (they are
            damaged), or the origin the newest lineage must fall back to is gone; the
            message names the damage and the way out.
        """
        ids = self.snapshots.checkpoint_ids()
        present = self.snapshots.shared_sizes() if ids else {}
        return resolve_restart_point(self.snapshots.job, ids, self.origins.read(),
                                     lambda cid: self.snapshots.checkpoint_entry(cid, present))
