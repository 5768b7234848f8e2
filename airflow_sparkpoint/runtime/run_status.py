"""The state of one run of `SparkpointJob.run` (`job._Run`) and what it reports: the
heartbeat, the status record and the run's result.

`_Run` is built in layers, one concern per module: this state and its status
(`run_status`), the start-up before the query (`run_startup`), the coordinator thread
(`run_coordination`), the query and staging (`job`).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.run_result import RunResult
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.exceptions import StaleGeneration, StorageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest
    from airflow_sparkpoint.runtime.checkpointer import Checkpointer
    from airflow_sparkpoint.runtime.committer import Committer
    from airflow_sparkpoint.runtime.config import SparkpointConfig
    from airflow_sparkpoint.runtime.rescale import RescalePlan
    from airflow_sparkpoint.runtime.restore import LiveChoice, LiveReuse
    from airflow_sparkpoint.runtime.restore_plan import RestorePlan
    from airflow_sparkpoint.sinks.base import Sink

__all__: list[str] = []

log = logging.getLogger(__name__)


class _RunStatus:
    """A run's state (set by `job._Run.__init__`, `_open` and `_prepare`), its heartbeat,
    status record and result."""

    # set by job._Run.__init__
    cfg: SparkpointConfig
    spark: SparkSession
    df: DataFrame
    sink: Sink
    output_mode: str
    query_name: str | None
    events: queue.Queue[tuple[str, Any]]
    stopping: threading.Event
    error: BaseException | None
    query: StreamingQuery | None
    batches_staged: int
    first_batch: int | None
    savepoint_uri: str | None
    stop_request: ControlRequest | None
    #: a stop_after request's batch in force, and the highest batch foreachBatch entered
    #: (set under `_stage_lock`, made by `job._Run.__init__`)
    stop_after: int | None = None
    highest_started: int | None = None
    _stage_lock: threading.Lock
    query_failed: bool
    _snapshot_settings: tuple[float, int]
    started_at: float
    _status_lock: threading.Lock
    _final_state: bool
    _heartbeat_stop: threading.Event
    _control_tidy_at: float
    _heap_trim_at: float
    _application_id: str
    # set by _open, execute and _prepare
    catalog: Catalog
    control: ControlChannel
    work_root: str
    #: the generation claimed by `job._Run.execute` (`generation`); None before the claim
    _generation: int | None = None
    #: the checkpointer built by `_prepare` (`checkpointer`); None before
    _checkpointer: Checkpointer | None = None
    plan: RestorePlan
    rescale: RescalePlan | None
    choice: LiveChoice
    live: str
    live_reuse: LiveReuse
    committer: Committer
    recovered: dict[str, Any]
    rescaled: dict[str, Any]

    @property
    def generation(self) -> int:
        """The generation this run claimed.

        :raises AttributeError: it has claimed none yet.
        """
        if self._generation is None:
            raise AttributeError("the run has claimed no generation yet")
        return self._generation

    @generation.setter
    def generation(self, generation: int) -> None:
        self._generation = generation

    @property
    def fence(self) -> Fence:
        """The fence of this run's generation: every effect of the run checks it first.

        :raises AttributeError: the run has claimed no generation yet.
        """
        return Fence(self.catalog, self.generation)

    @property
    def checkpointer(self) -> Checkpointer:
        """The run's checkpointer (built by the start-up).

        :raises AttributeError: the start-up has not built it yet.
        """
        if self._checkpointer is None:
            raise AttributeError("the run's start-up has not built its checkpointer yet")
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, checkpointer: Checkpointer) -> None:
        self._checkpointer = checkpointer

    def _heartbeat(self) -> None:
        self._write_status("running")

    def _heartbeat_loop(self) -> None:
        while not self._heartbeat_stop.wait(self.cfg.poll_interval_s):
            self._heartbeat()

    def _write_status(self, state: str, error: str | None = None) -> None:
        checkpointer = self._checkpointer
        last = checkpointer.last_checkpoint if checkpointer is not None else None
        status = JobStatus(
            job=self.cfg.job, generation=self.generation, state=state, started_at=self.started_at,
            heartbeat_at=time.time(),
            last_batch=checkpointer.confirmed_batch if checkpointer is not None else None,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint_uri=self.catalog.checkpoint_uri(last.id) if last else None,
            checkpoints_completed=checkpointer.checkpoints_completed if checkpointer is not None else 0,
            savepoint_uri=self.savepoint_uri, error=error, host=socket.gethostname(), pid=os.getpid(),
            application_id=self._application_id, live_dir=getattr(self, "live", None),
        ).to_json()
        with self._status_lock:
            if self._final_state and state == "running":
                return  # a late heartbeat must not undo finished/stopped/failed
            if state != "running":
                self._final_state = True
            try:
                # One existence check (claims are contiguous), not a listing of every generation.
                self.fence.check()
                self.catalog.write_status(status)
            except StaleGeneration:
                return  # a newer run owns the status record
            except StorageError as exc:
                log.warning("could not write the status of job %s: %s", self.cfg.job, exc)

    def _result(self, state: str) -> RunResult:
        last = self.checkpointer.last_checkpoint
        return RunResult(
            status=state, job=self.cfg.job, generation=self.generation,
            batches_processed=self.batches_staged, first_batch=self.first_batch,
            last_batch=self.checkpointer.confirmed_batch,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint=self.catalog.checkpoint_uri(last.id) if last else None,
            savepoint=self.savepoint_uri,
            restored_from=self.plan.snapshot.uri if self.plan.snapshot else None,
            restore_mode=("in-place" if self.choice.in_place
                          else ("snapshot" if self.plan.snapshot else "empty")),
            checkpoints_completed=self.checkpointer.checkpoints_completed,
            **RunResult.committed(self.committer.batches_committed),
            recovered=self.recovered,
            live_dir=self.live,
            live_reuse=self.live_reuse.to_json(),
            rescaled=self.rescaled,
        )
