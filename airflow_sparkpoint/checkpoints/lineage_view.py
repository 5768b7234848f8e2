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
)
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.origins import OriginStore
from airflow_sparkpoint.checkpoints.snapshot_store import SnapshotStore
from airflow_sparkpoint.exceptions import RestoreError

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
        """The checkpoint the newest lineage stands at (invariant 9): the one
        ``restore=latest`` would restore (`restart_point`), or None when that is a
        snapshot of another kind (the savepoint or pin the lineage started from, before
        its first checkpoint), empty state, or nothing restorable (damage is logged).

        What the external commit step, the sensors and savepoints-from-checkpoint use:
        never a checkpoint the newest lineage abandoned, also not a fenced writer's late
        one on an id retention freed once the origin that superseded it is pruned.
        Validates newest-first and stops at the first answer, so the cost grows with the
        number of retained checkpoints (and generations), not with every file ever written.
        """
        ids = self.snapshots.checkpoint_ids()
        if not ids:
            return None
        present = self.snapshots.shared_sizes()
        try:
            point = resolve_restart_point(self.snapshots.job, ids, self.origins.read(),
                                          lambda cid: self.snapshots.checkpoint_entry(cid, present))
        except RestoreError:
            return None
        return point.checkpoint

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
