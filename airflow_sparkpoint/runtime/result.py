"""`RunResult`: how a run of `SparkpointJob.run` ended (pushed to XCom by the operator)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunResult:
    """How a run ended. Returned by `SparkpointJob.run` and pushed to XCom by the operator."""

    status: str  # "finished" | "stopped"
    job: str
    generation: int
    batches_processed: int = 0
    first_batch: int | None = None
    last_batch: int | None = None
    last_checkpoint_id: int | None = None
    last_checkpoint: str | None = None
    savepoint: str | None = None
    restored_from: str | None = None
    restore_mode: str = ""  # "in-place" | "snapshot" | "empty"
    checkpoints_completed: int = 0
    committed_batches: tuple[int, ...] = ()
    recovered: Mapping[str, Any] = field(default_factory=dict)
    #: Spark's live checkpoint location this run used (never shared with a running generation)
    live_dir: str = ""
    #: how it was prepared: mode ("in-place" | "materialized" | "empty"), files ``linked`` from
    #: the previous location and ``downloaded`` from the snapshot, and the reason
    live_reuse: Mapping[str, Any] = field(default_factory=dict)
    #: ``restore.statePartitions``: ``from`` and ``to`` state partitions and the
    #: repartitioner's synthetic ``batch`` (never staged); empty when nothing was rescaled
    rescaled: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["committed_batches"] = list(self.committed_batches)
        return data
