"""`RestorePlan`: what a run starts from (decided by `restore.plan_restore`; read by the
restore steps and by `rescale`)."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_sparkpoint.checkpoints import SnapshotHandle
from airflow_sparkpoint.checkpoints.lineage import Origin

__all__ = ["RestorePlan"]


@dataclass(frozen=True)
class RestorePlan:
    """What the run starts from."""

    snapshot: SnapshotHandle | None  # None: empty state
    description: str
    kind: str = "empty"  # what the origin records: "checkpoint" | "savepoint" | "empty"
    base_id: int = -1  # the checkpoint of this job it continues (lineage.Origin.base_id)
    own_files: bool = False  # the snapshot's files are this job's shared files
    sink_ahead: str = "fail"  # the policy for this restart (a lineage's rewind is inherited)
    continues: Origin | None = None  # the origin of the lineage whose starting point this is
    latest: bool = False  # chosen by restore=latest: a sink ahead of it may be replayed (runtime.replay)

    @property
    def batch_id(self) -> int | None:
        return self.snapshot.metadata.batch_id if self.snapshot else None

    @property
    def own_checkpoint(self) -> bool:
        """A checkpoint of this job in this catalog (the only thing resumable in place)."""
        return self.kind == "checkpoint" and self.base_id >= 0 and self.own_files
