"""`ShadowSink`: what a shadow run (`runtime.follow`, zero-downtime blue-green) writes
instead of the user's sink: nothing visible anywhere, so the shadow can never touch blue's
output.

* ``discard``: the batch is consumed with Spark's ``noop`` format (every partition runs,
  so every state store of the batch commits, DESIGN §7) and nothing is kept.
* ``compare``: the batch's rows are staged as Parquet in ``<dir>/<job>/batch-<N>`` (a
  local scratch directory of the shadow's own; overwritten when the batch runs again) for
  the comparison with what blue committed for that batch (`runtime.follow_compare`).

Commit and abort keep nothing: the shadow's transactions exist only so that its
checkpoints and recovery work as a normal run's; `committed_position` is always None (the
shadow is never ahead of any restore point).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["MODES", "ShadowSink"]

MODES = ("discard", "compare")


class ShadowSink(Sink):
    """Consume (``discard``) or stage into a scratch directory (``compare``) each batch;
    make nothing visible (see the module docstring)."""

    kind = "shadow"

    def __init__(self, mode: str = "discard", dir: str | None = None) -> None:
        if mode not in MODES:
            raise ConfigError(f"ShadowSink mode={mode!r} is not allowed; expected one of {', '.join(MODES)}")
        if mode == "compare" and not dir:
            raise ConfigError("ShadowSink mode='compare' needs dir (a local scratch directory)")
        self.mode = mode
        self.dir = dir

    @property
    def sink_id(self) -> str:
        return f"shadow:{self.mode}:{self.dir or ''}"

    def to_config(self) -> dict[str, Any]:
        return {"mode": self.mode, "dir": self.dir}

    def batch_dir(self, job: str, batch_id: int) -> str:
        """Where compare mode stages batch `batch_id` of `job`.

        :raises ConfigError: the sink is in discard mode (it stages nowhere)."""
        if self.dir is None:
            raise ConfigError("a ShadowSink in discard mode stages no rows")
        return os.path.join(self.dir, job, f"batch-{batch_id}")

    def stage(self, df: DataFrame, ctx: StageContext) -> dict[str, Any]:
        if self.mode == "discard":
            df.write.format("noop").mode("overwrite").save()
            return {"mode": "discard"}
        path = self.batch_dir(ctx.job, ctx.batch_id)
        df.write.mode("overwrite").parquet(path)
        return {"mode": "compare", "path": path}

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        return CommitOutcome(record.txn_id, "committed", {"shadow": True})

    def is_committed(self, record: TransactionRecord) -> bool:
        return False

    def abort(self, record: TransactionRecord) -> None:
        return None

    def committed_position(self, job: str) -> int | None:
        return None
