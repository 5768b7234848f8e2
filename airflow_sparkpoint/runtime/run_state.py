"""What one run of `SparkpointJob.run` knows (`RunState`): its inputs, the generation it
claimed, its catalog, restore plan, live location, checkpointer and committer, and the
flags its threads share.

The run's phases take it: the start-up (`run_startup.RunStartup`) fills it, the
coordinator thread (`run_coordination.RunCoordinator`) and the query (`job._Run`) act on
it, the status writer (`run_status.StatusWriter`) reports it. What the start-up has not
set yet raises `AttributeError` when read, as an attribute never set would.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.generations import Fence

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest
    from airflow_sparkpoint.runtime.checkpointer import Checkpointer
    from airflow_sparkpoint.runtime.committer import Committer
    from airflow_sparkpoint.runtime.config import SparkpointConfig
    from airflow_sparkpoint.runtime.follow import Adopted, Shadowing
    from airflow_sparkpoint.runtime.rescale import RescalePlan
    from airflow_sparkpoint.runtime.restore import LiveChoice, LiveReuse
    from airflow_sparkpoint.runtime.restore_plan import RestorePlan
    from airflow_sparkpoint.sinks.base import Sink

__all__ = ["RunState"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RunState:
    """The state of one run (one generation), shared by its phases and threads."""

    cfg: SparkpointConfig
    spark: SparkSession
    df: DataFrame
    sink: Sink
    output_mode: str
    query_name: str | None
    #: Spark's application id, asked once (a JVM call)
    application_id: str
    #: a shadow run: it follows blue's batches instead of planning its own (`runtime.follow`)
    shadowing: Shadowing | None = None
    #: green's run after it took the job over at a cutover: its generation is claimed already
    adopted: Adopted | None = None
    #: close this JVM's state stores at the run's end (`unload_state_stores`); False for a
    #: shadow that hands over: green's production run follows in this JVM and closes them
    close_state_stores: bool = True

    # -- shared by the threads -------------------------------------------------------
    #: the coordinator thread's events: ``progress`` (batch), ``tick``, ``final``
    events: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    #: set once the run takes on no new batch (a stop, a cancel, SIGTERM, a failure)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: the run's failure (the coordinator thread's, a stale generation, SIGTERM)
    error: BaseException | None = None
    query: StreamingQuery | None = None
    #: the streaming query ended with an error
    query_failed: bool = False
    batches_staged: int = 0  # foreachBatch calls
    first_batch: int | None = None  # the lowest batch id staged
    savepoint_uri: str | None = None
    #: the stop, cancel or stop_after request the run is ending (or will end) for
    stop_request: ControlRequest | None = None
    #: a stop_after request's batch in force (no batch past it is staged) and the highest
    #: batch foreachBatch was entered for, both under `stage_lock`
    stop_after: int | None = None
    highest_started: int | None = None
    stage_lock: threading.Lock = field(default_factory=threading.Lock)
    started_at: float = field(default_factory=time.time)

    # -- set by the start-up (`run_startup`) -----------------------------------------
    catalog: Catalog = field(init=False)
    control: ControlChannel = field(init=False)
    work_root: str = field(init=False)
    #: the generation claimed by `job._Run.execute` (`generation`); None before the claim
    claimed: int | None = None
    plan: RestorePlan = field(init=False)
    rescale: RescalePlan | None = field(init=False)
    #: the live location chosen and locked for this run; None before the choice
    choice: LiveChoice | None = None
    live_reuse: LiveReuse = field(init=False)
    committer: Committer = field(init=False)
    #: the checkpointer built by the start-up (`checkpointer`); None before
    built_checkpointer: Checkpointer | None = None
    recovered: dict[str, Any] = field(init=False)
    rescaled: dict[str, Any] = field(init=False)
    #: the path of the live location (`live`); None before the start-up chose it
    live_dir: str | None = None

    @property
    def generation(self) -> int:
        """The generation this run claimed.

        :raises AttributeError: it has claimed none yet.
        """
        if self.claimed is None:
            raise AttributeError("the run has claimed no generation yet")
        return self.claimed

    @generation.setter
    def generation(self, generation: int) -> None:
        self.claimed = generation

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
        if self.built_checkpointer is None:
            raise AttributeError("the run's start-up has not built its checkpointer yet")
        return self.built_checkpointer

    @checkpointer.setter
    def checkpointer(self, checkpointer: Checkpointer) -> None:
        self.built_checkpointer = checkpointer

    @property
    def live(self) -> str:
        """The run's live location (Spark's checkpoint location).

        :raises AttributeError: the start-up has not chosen it yet.
        """
        if self.live_dir is None:
            raise AttributeError("the run's start-up has not chosen its live location yet")
        return self.live_dir

    @live.setter
    def live(self, path: str) -> None:
        self.live_dir = path

    def stop_query(self) -> None:
        """Ask the streaming query, if any, to stop; never raise for a query already gone."""
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:  # noqa: BLE001 - the query may already be gone
                log.debug("query.stop(): %s", exc)

    def unload_state_stores(self) -> None:
        """Close the state stores this JVM still holds (local mode runs executors in the
        driver), once the query has ended; never raise.

        Why: Spark keeps a stopped query's RocksDB instances open until its maintenance
        unloads them, and nothing closes them at JVM exit. When the JVM exits with
        RocksDB's background threads alive, its native teardown can abort the process
        ("terminate called after throwing an instance of 'std::bad_alloc'", SIGABRT):
        a run that finished and printed its result then fails as an Airflow task.
        """
        try:
            jvm: Any = self.spark.sparkContext._jvm
            jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
        except Exception as exc:  # noqa: BLE001 - the JVM may be gone (a kill, a failed start)
            log.debug("StateStore.stop(): %s", exc)

    def release_live(self) -> None:
        """Release the lock of the live location, if the start-up took one."""
        if self.choice is not None:
            self.choice.lock.release()
