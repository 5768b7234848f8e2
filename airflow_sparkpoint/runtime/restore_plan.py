"""`RestorePlan`: what a run starts from (decided by `restore.plan_restore`; read by the
restore steps and by `rescale`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints import SnapshotHandle
from airflow_sparkpoint.checkpoints.lineage import Origin
from airflow_sparkpoint.runtime.livedir import local_path_of

if TYPE_CHECKING:
    from airflow_sparkpoint.sinks.base import Sink

__all__ = ["RestorePlan", "under_root"]


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
    code_version: str | None = None  # the run's job code: only batches it committed are replayed

    @property
    def batch_id(self) -> int | None:
        return self.snapshot.metadata.batch_id if self.snapshot else None

    def replays_ahead(self, sink: Sink, policy: str | None = None) -> bool:
        """Whether a sink ahead of the restart point is replayed exactly (`runtime.replay`)
        rather than rewound or refused: with ``restore=latest``, wherever the policy
        (`policy`, else the plan's) does not rewind, or no rewind can happen (the sink
        cannot rewind, or empty state has nothing to rewind to)."""
        rewinds = (policy or self.sink_ahead) == "rewind" and self.snapshot is not None and sink.can_rewind
        return self.latest and not rewinds

    @property
    def own_checkpoint(self) -> bool:
        """A checkpoint of this job in this catalog (the only thing resumable in place)."""
        return self.kind == "checkpoint" and self.base_id >= 0 and self.own_files


def under_root(uri: str, root: str) -> bool:
    """Whether `uri` lies under `root` (a snapshot in a job's own root); plain paths and
    ``file://`` URIs compare alike."""
    def canonical(text: str) -> str:
        local = local_path_of(text)
        return (local if local is not None else text).rstrip("/")

    return canonical(uri).startswith(canonical(root) + "/")
