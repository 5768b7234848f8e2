"""`SparkpointJob`: a checkpointed Structured Streaming run in the Spark driver.

::

    job = SparkpointJob.get_or_create(app_name="orders")   # reads spark.sparkpoint.* conf
    result = job.run(df, sink=DeltaSink(job.arg("output")), output_mode="update")

Threads in the driver: Spark's stream thread calls `_stage_batch` through
``foreachBatch``; the listener feeds confirmed batch ids to the coordinator thread,
which alone takes checkpoints, savepoints and commits, polls the control channel and
writes the heartbeat; the caller's thread waits for the query and for the coordinator.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest
from airflow_sparkpoint.checkpoints.history import generation_details
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.status import JobStatus, result_key
from airflow_sparkpoint.exceptions import (
    ConfigError,
    ObjectExists,
    SparkpointError,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.runtime import livedir, replay, rescale, signals
from airflow_sparkpoint.runtime.config import PREFIX, SUBMITTER_ENV, SparkpointConfig, parse_duration
from airflow_sparkpoint.runtime.coordinator import Coordinator
from airflow_sparkpoint.runtime.restore import (
    check_sink_position,
    choose_live,
    fill_live,
    pin_restart_point,
    plan_restore,
    recover_transactions,
    settle_unconfirmed,
)
from airflow_sparkpoint.runtime.result import RunResult
from airflow_sparkpoint.sinks.base import Sink, StageContext
from airflow_sparkpoint.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
_MISSING = object()
#: Spark's RocksDB provider looks every written key up first to count the rows in state
#: (``numRowsTotal``); a restart replays the changelog since the last RocksDB snapshot
#: through the same writes, so the count costs a restore about 2.5x its state load
#: (docs/BENCHMARKS.md, restore at 2,000,000 keys). Off unless the user sets it.
TRACK_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"


class _StopRun(Exception):
    """Raised inside foreachBatch when a stop was requested: the batch must not record."""


class SparkpointJob:
    """A PySpark pipeline with Flink-grade checkpoints (see the module docstring)."""

    def __init__(self, spark: SparkSession, config: SparkpointConfig, argv: Sequence[str] | None = None) -> None:
        self.spark = spark
        self.config = config
        self._argv = list(sys.argv[1:] if argv is None else argv)
        self._args = _parse_args(self._argv)

    # ------------------------------------------------------------------ construction

    @classmethod
    def get_or_create(
        cls,
        app_name: str | None = None,
        *,
        conf: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
    ) -> SparkpointJob:
        """Get or create the SparkSession with Sparkpoint's defaults and validate every
        ``spark.sparkpoint.*`` setting (from ``--conf`` or `conf`) before anything is written.

        :raises ConfigError: a setting is missing or invalid.
        """
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        # Launch (or attach to spark-submit's) JVM first, so that SparkConf() sees the
        # --conf values spark-submit passed as system properties.
        SparkContext._ensure_initialized()
        spark_conf = SparkConf()
        for key, value in (conf or {}).items():
            spark_conf.set(key, str(value))
        settings = {k: v for k, v in spark_conf.getAll() if k.startswith(PREFIX)}
        active = SparkSession.getActiveSession()
        if active is not None:
            for key, value in active.sparkContext.getConf().getAll():
                if key.startswith(PREFIX):
                    settings.setdefault(key, value)
        config = SparkpointConfig.from_conf(settings)
        if config.test_pause_at:  # test-only pause points (airflow_sparkpoint.faults.pause)
            os.environ[faults.PAUSE_ENV] = config.test_pause_at
            os.environ[faults.PAUSE_DIR_ENV] = config.test_pause_dir
        provider = ROCKSDB_PROVIDER if config.state_store == "rocksdb" else HDFS_PROVIDER
        defaults = {
            "spark.sql.streaming.stateStore.providerClass": provider,
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
            TRACK_ROWS: "false",
            # INT96 timestamps are legacy; Delta readers expect microsecond timestamps.
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        }
        for key, value in defaults.items():
            spark_conf.setIfMissing(key, value)
        builder = SparkSession.builder.config(conf=spark_conf)
        if app_name:
            builder = builder.appName(app_name)
        spark = builder.getOrCreate()
        # SQL settings also apply to an already running session (e.g. in tests).
        user_set = dict(spark_conf.getAll())
        for key in ("spark.sql.streaming.stateStore.providerClass",
                    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                    "spark.sql.parquet.outputTimestampType"):
            spark.conf.set(key, user_set.get(key, defaults[key]))
        return cls(spark, config, argv)

    def arg(self, name: str, default: Any = _MISSING) -> str:
        """The value of the ``--name value`` application argument.

        :raises ConfigError: the argument was not given and there is no default.
        """
        if name in self._args:
            return self._args[name]
        if default is not _MISSING:
            return default  # type: ignore[no-any-return]
        given = ", ".join(f"--{k}" for k in self._args) or "none"
        raise ConfigError(f"application argument --{name} is required (given: {given})")

    # ------------------------------------------------------------------ run

    def run(
        self,
        df: DataFrame,
        *,
        sink: Sink,
        output_mode: str = "append",
        query_name: str | None = None,
    ) -> RunResult:
        """Run `df` into `sink` with checkpoints until the input is drained
        (``availableNow``) or a stop-with-savepoint request arrives.

        :raises ConfigError: bad arguments, before anything is written.
        :raises RestoreError: the restore target is unusable, or a sink is ahead of it.
        :raises SparkpointError: the query or the checkpointing failed (with the cause).
        """
        if output_mode not in ("append", "update", "complete"):
            raise ConfigError(f"output_mode={output_mode!r} is not allowed; expected append, update or complete")
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink={sink!r} is not a Sparkpoint sink; expected DeltaSink, S3Sink or DirectorySink")
        if not df.isStreaming:
            raise ConfigError("run() needs a streaming DataFrame (spark.readStream...); got a batch DataFrame")
        run = _Run(self, df, sink, output_mode, query_name)
        with signals.sigterm_ends_run(run):  # a killed task: record the end, act no more
            return run.execute()


def _parse_args(argv: Sequence[str]) -> dict[str, str]:
    args: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            if eq:
                args[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                args[name] = argv[i + 1]
                i += 1
            else:
                args[name] = "true"
        i += 1
    return args


class _Run:
    """One execution of `SparkpointJob.run` (one generation)."""

    def __init__(self, job: SparkpointJob, df: DataFrame, sink: Sink, output_mode: str, name: str | None) -> None:
        self.job = job
        self.cfg = job.config
        self.spark = job.spark
        self.df = df
        self.sink = sink
        self.output_mode = output_mode
        self.query_name = name
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.query: StreamingQuery | None = None
        self.batches: list[int] = []
        self.savepoint_uri: str | None = None
        self.stop_request: ControlRequest | None = None
        self.query_failed = False  # the streaming query ended with an error
        self._snapshot_settings = (60.0, 10)  # Spark's, read when the query starts
        self.started_at = time.time()
        self._status_lock = threading.Lock()
        self._final_state = False
        self._heartbeat_stop = threading.Event()
        self._terminated: set[str] = set()  # ids of the queries whose termination event arrived
        self._terminated_cv = threading.Condition()
        self._application_id = self.spark.sparkContext.applicationId  # asked once: a JVM call

    # -- preparation: everything that can fail does so before anything is written -----

    def _open(self) -> None:
        cfg = self.cfg
        try:
            storage = open_storage(cfg.dir, **cfg.storage_options)
        except Exception as exc:
            raise ConfigError(f"{PREFIX}dir={cfg.dir!r} cannot be opened: {exc}") from exc
        check = getattr(storage, "check", None)
        try:
            if callable(check):
                check()
            else:
                storage.exists("_sparkpoint_probe")
            exclusive = getattr(storage, "check_exclusive_create", None)
            if callable(exclusive):
                exclusive()  # generation claims are conditional creates
        except StorageError as exc:
            raise StorageError(f"{PREFIX}dir={cfg.dir!r} is not reachable: {exc}") from exc
        self.catalog = Catalog(storage, cfg.job)
        self.control = ControlChannel(self.catalog)
        self.sink.configure(cfg.storage_options)
        self.sink.validate()
        work = cfg.work_dir
        if work is None:
            if cfg.dir_is_s3:
                raise ConfigError(
                    f"{PREFIX}workDir is required when {PREFIX}dir={cfg.dir!r} is on S3 (Spark's live checkpoint "
                    "needs a Hadoop filesystem path, e.g. a local disk path)"
                )
            root = livedir.require_local(cfg.dir)
            work = os.path.join(root, cfg.job, "live")
        self.work_root = livedir.require_local(work)

    def execute(self) -> RunResult:
        self._open()
        cfg = self.cfg
        # A read-only pre-check: bad input (a missing or foreign snapshot, damaged
        # checkpoints, a sink ahead) fails before anything is written (invariant 7).
        pre = plan_restore(cfg, self.catalog)
        check_sink_position(pre, self.sink, cfg.job, apply=False)
        rescale.check_shuffle_partitions(dict(self.spark.sparkContext.getConf().getAll()),
                                         rescale.plan_rescale(cfg.restore_state_partitions, pre))
        faults.pause("after_plan", pre.batch_id)
        self.generation = self.catalog.claim_generation(
            {"restore": cfg.restore, "plan": pre.description, "app": self._application_id,
             # which submit this is (the Airflow operator finds its own run by it) and its UI
             "submitter": os.environ.get(SUBMITTER_ENV, ""), "ui": self.spark.sparkContext.uiWebUrl,
             **generation_details(cfg)}  # config in force + Airflow try, for the history model
        ).generation
        try:
            self._prepare()
        except BaseException as exc:
            coordinator: Coordinator | None = getattr(self, "coordinator", None)
            if coordinator is not None:
                coordinator.stop_prestore()
            self._write_status("failed", error=str(exc))
            self._release_live()
            raise
        return self._run_query()

    def _prepare(self) -> None:
        """Claim, then act (invariant 8): everything is read again after the claim, the
        origin of this generation's lineage is recorded before any effect, and every
        effect is fenced by the generation."""
        cfg = self.cfg
        plan = self.plan = plan_restore(cfg, self.catalog)
        check_sink_position(plan, self.sink, cfg.job, apply=False)
        self.rescale = rescale.plan_rescale(cfg.restore_state_partitions, plan)
        status = self.catalog.read_status() or {}
        origins = self.catalog.origins()
        self.choice = choose_live(
            plan, [origins[-1].live_dir if origins else None, status.get("live_dir")], status,
            work_root=self.work_root, job=cfg.job, generation=self.generation, jvm_pid=self._jvm_pid(),
            allow_in_place=not (self.rescale and self.rescale.needed),  # rescale a private copy only
        )
        self.live = self.choice.path
        meta: SnapshotMetadata | None = plan.snapshot.metadata if plan.snapshot else None
        inherited = plan.continues.restore if plan.continues is not None else {}
        pin = pin_restart_point(plan, self.catalog, self.generation)  # owned before the origin relies on it
        self.catalog.write_origin(new_origin(
            self.generation, kind=plan.kind, uri=plan.snapshot.uri if plan.snapshot else None, base_id=plan.base_id,
            snapshot_id=meta.id if meta else None, batch_id=meta.batch_id if meta else None,
            id_floor=self.catalog.next_checkpoint_id() - 1,
            restore={"restore": cfg.restore, "sink_ahead": plan.sink_ahead, "force": cfg.restore_force,
                     "allow_foreign_job": cfg.restore_allow_foreign_job or bool(inherited.get("allow_foreign_job")),
                     "state_partitions": cfg.restore_state_partitions},
            live_dir=self.live, host=socket.gethostname(), pid=os.getpid(), pin=pin,
        ))
        log.info("job %s generation %d starts from %s; live location %s (%s)",
                 cfg.job, self.generation, plan.description, self.live, self.choice.reason)

        def fence() -> None:
            self.catalog.check_generation(self.generation)

        fence()
        # Abort what the restart point does not confirm before the sink's position is
        # checked: a stalled committer past its generation check can land nothing after it.
        settled = settle_unconfirmed(self.catalog, self.sink, plan, self.generation)
        if check_sink_position(plan, self.sink, cfg.job, fence=fence):
            faults.pause("after_rewind", plan.batch_id, generation=self.generation)
        faults.pause("before_live", plan.batch_id, generation=self.generation)
        index, self.live_reuse = fill_live(self.choice, plan)
        self.coordinator = Coordinator(
            catalog=self.catalog, sink=self.sink, generation=self.generation, live_root=self.live,
            commit_mode=cfg.commit_mode, interval_s=cfg.checkpoint_interval_s,
            num_retained=cfg.num_retained, timeout_s=cfg.checkpoint_timeout_s,
            tolerable_failures=cfg.tolerable_failures, spark_info=self._spark_info(),
            on_status=self._heartbeat,
        )
        self.coordinator.seed(meta, index)
        if plan.snapshot is not None and not plan.own_files:
            self.coordinator.prestore(plan.snapshot.files_store)  # overlaps Spark's first batch
        pending, recovered = recover_transactions(self.catalog, self.sink, plan, cfg.commit_mode, self.generation,
                                                  settled=settled)
        for record in pending:
            self.coordinator.add_pending(record)
        if plan.latest and plan.sink_ahead != "rewind":  # the self-healing fallback (runtime.replay)
            self._write_status("running")  # a long replay must not look like a dead run
            recovered["replayed"] = replay.replay_committed(
                self.spark, self.df, self.output_mode, sink=self.sink, catalog=self.catalog, snapshot=plan.snapshot,
                live_root=self.live, generation=self.generation, job=cfg.job)
            if recovered["replayed"]:  # the snapshot's position of this sink is behind what it holds now
                self.coordinator.sink_positions.pop(self.sink.sink_id, None)
        self.recovered = recovered
        # After any replay: the state of the live location's last batch is rescaled.
        rescaled = rescale.rescale_live(self.spark, self.live, self.rescale, fence) if self.rescale and \
            self.rescale.needed else None
        self.rescaled = rescale.summary(self.rescale, rescaled)
        rescale.apply_shuffle_partitions(self.spark, self.rescale)
        if rescaled is not None:
            # The rescaled state is the restart point from now on (no input, no transaction).
            self.coordinator.confirm(rescaled)
            self.coordinator.checkpoint(rescaled)
        self._write_status("running")

    def _jvm_pid(self) -> int | None:
        try:
            return int(self.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - only used to prove a previous owner gone
            return None

    def _release_live(self) -> None:
        choice = getattr(self, "choice", None)
        if choice is not None:
            choice.lock.release()

    def _spark_info(self) -> dict[str, Any]:
        conf = self.spark.conf
        return {
            "version": self.spark.version,
            "state_store": conf.get("spark.sql.streaming.stateStore.providerClass", ""),
            "output_mode": self.output_mode,
            "trigger": str(self.cfg.trigger),
        }

    # -- the query ----------------------------------------------------------------------

    def _run_query(self) -> RunResult:
        from pyspark.sql.streaming import StreamingQueryListener

        run = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                if run.query is not None and str(event.progress.id) == str(run.query.id):
                    run.events.put(("progress", int(event.progress.batchId)))

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                with run._terminated_cv:
                    run._terminated.add(str(event.id))
                    run._terminated_cv.notify_all()

        listener = Listener()
        self.spark.streams.addListener(listener)
        coordinator_thread = threading.Thread(target=self._coordinate, name="sparkpoint-coordinator", daemon=True)
        # Its own thread, so a long final checkpoint or savepoint never looks like a dead job.
        heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="sparkpoint-heartbeat", daemon=True)
        try:
            writer = (
                self.df.writeStream.outputMode(self.output_mode)
                .foreachBatch(self._stage_batch)
                .option("checkpointLocation", self.live)
                .trigger(**self.cfg.trigger.spark_kwargs())
            )
            if self.query_name:
                writer = writer.queryName(self.query_name)
            self._snapshot_settings = self._state_store_settings()  # the JVM may be gone at the end
            self.query = writer.start()
            coordinator_thread.start()
            heartbeat_thread.start()
            query_error: BaseException | None = None
            try:
                self.query.awaitTermination()
            except Exception as exc:  # noqa: BLE001 - re-raised below with context
                query_error = exc
            # The last progress events may still be on their way: `_finish` confirms
            # from commits/ itself, so they are not waited for here.
            self.query_failed = query_error is not None
            self.events.put(("final", None))
            coordinator_thread.join()
            return self._conclude(query_error)
        finally:
            self._heartbeat_stop.set()
            self.coordinator.stop_prestore()
            self._release_live()
            # The bus delivers this query's events in order, its termination last. Removing
            # the listener before that arrived could leave a callback in flight into a
            # Python process that is exiting (an error in the job's log). It arrives
            # tens of milliseconds after the query ended: meanwhile the final checkpoint,
            # commit and status were written.
            if self.query is not None:
                query_id = str(self.query.id)
                with self._terminated_cv:
                    self._terminated_cv.wait_for(lambda: query_id in self._terminated, timeout=10)
            self.spark.streams.removeListener(listener)

    def _conclude(self, query_error: BaseException | None) -> RunResult:
        """Raise the run's failure, or record its result and return it."""
        if self.error is not None:
            self._write_status("failed", error=str(self.error))
            if isinstance(self.error, SparkpointError):
                raise self.error
            raise SparkpointError(f"job {self.cfg.job!r} failed: {self.error}") from self.error
        if query_error is not None and not self.stopping.is_set():
            self._write_status("failed", error=str(query_error))
            raise SparkpointError(f"streaming query of job {self.cfg.job!r} failed: {query_error}") from query_error
        state = "stopped" if self.stopping.is_set() else "finished"
        result = self._result(state)
        self._write_status(state)
        self.catalog.store.put(result_key(self.generation), json.dumps(result.to_json()).encode())
        livedir.remove_unowned(self.work_root, self.live, self.generation)
        log.info("job %s generation %d %s: %s", self.cfg.job, self.generation, state, json.dumps(result.to_json()))
        return result

    def _stage_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: stage the batch in the sink and record its pre-commit durably."""
        if self.stopping.is_set():
            raise _StopRun(f"job {self.cfg.job!r} is stopping; batch {batch_id} is not run")
        faults.pause("stage", batch_id, generation=self.generation)
        ctx = StageContext(self.cfg.job, int(batch_id), self.generation, self.cfg.storage_options,
                           self.cfg.driver_staging_max_bytes)
        payload = self.sink.stage(df, ctx)
        faults.maybe_kill("stage", batch_id)
        record = TransactionRecord(
            job=self.cfg.job, batch_id=int(batch_id), generation=self.generation, sink=self.sink.kind,
            sink_id=self.sink.sink_id, created_at=time.time(),
            # the commit keeps how to replay the batch (the self-healing fallback, runtime.replay)
            payload={"config": self.sink.to_config(), "staged": payload,
                     "replay": replay.capture(self.live, int(batch_id))},
        )
        if self.stopping.is_set():
            self.sink.abort(record)
            raise _StopRun(f"job {self.cfg.job!r} is stopping; batch {batch_id} is discarded")
        try:
            # A superseded driver (a cleared try's, a stalled one) that staged after the
            # newer generation's recovery would leave its staging and record behind: it
            # takes its own staged data away and stops before recording anything.
            self.catalog.check_generation(self.generation)
        except StaleGeneration as exc:
            self.sink.abort(record)
            if self.error is None:
                self.error = exc  # the run ends with it, not with Spark's wrapper of it
            raise
        self.catalog.put_transaction(record)
        self.coordinator.add_pending(record)
        self.batches.append(int(batch_id))
        faults.maybe_kill("record", batch_id)
        faults.pause("recorded", batch_id)
        if self.stopping.is_set():
            # A stop taken while this batch ran: fail it, so Spark never commits it and the
            # stop aborts it (whether Spark's own stop would still commit it is a race).
            raise _StopRun(f"job {self.cfg.job!r} is stopping; batch {batch_id} is discarded")

    # -- the coordinator thread -----------------------------------------------------------

    def _coordinate(self) -> None:
        next_poll = 0.0
        try:
            while True:
                timeout = max(0.0, next_poll - time.monotonic())
                try:
                    kind, value = self.events.get(timeout=timeout)
                except queue.Empty:
                    kind, value = "tick", None
                if kind == "progress":
                    self._confirm(value)
                    if self.coordinator.due() and self.events.empty():
                        self._checkpoint_and_commit(self.coordinator.confirmed_batch)
                elif kind == "final":
                    self._finish()
                    return
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.cfg.poll_interval_s
                    if not self.stopping.is_set():
                        self._serve_control()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc
            log.error("job %s generation %d: %s", self.cfg.job, self.generation, exc)
            self.stopping.set()
            self._stop_query()
            # Keep draining so the caller's final event finds us gone.

    def _confirm(self, batch_id: int) -> None:
        """Batch `batch_id` is durable in Spark's commits/ (from its progress event, or read
        from commits/ after the query ended)."""
        confirmed = self.coordinator.confirmed_batch
        if confirmed is None or batch_id > confirmed:
            faults.maybe_kill("confirmed", batch_id)
        self.coordinator.confirm(batch_id)

    def _checkpoint_and_commit(self, batch_id: int | None) -> None:
        if batch_id is None or self.error is not None:  # failing or terminating: nothing new
            return
        meta = self.coordinator.checkpoint(batch_id)
        if meta is not None:
            self.coordinator.commit_confirmed()

    def _finish(self) -> None:
        """After the query ended: checkpoint its last confirmed batch, then commit."""
        if self.error is not None:
            return
        last = livedir.last_commit(self.live)
        if last is not None:
            self._confirm(last)  # its progress event may not have arrived
        latest = self.coordinator.last_checkpoint
        if last is not None and (latest is None or latest.batch_id < last):
            meta = self.coordinator.checkpoint(last)
            if meta is None:
                raise SparkpointError(f"final checkpoint of batch {last} failed")
        self.coordinator.commit_confirmed()
        self._checkpoint_final_snapshot()
        if self.error is not None:  # e.g. SIGTERM during the wait: take on nothing new
            return
        if self.stopping.is_set():
            self.coordinator.abort_unconfirmed(self.coordinator.last_checkpoint.batch_id
                                               if self.coordinator.last_checkpoint else None)
            if self.stop_request is not None:
                self._complete_stop()

    def _state_store_settings(self) -> tuple[float, int]:
        """Spark's ``stateStore.maintenanceInterval`` (seconds) and ``minDeltasForSnapshot``."""
        conf = self.spark.conf
        interval = str(conf.get("spark.sql.streaming.stateStore.maintenanceInterval", "60s") or "60s").strip()
        try:  # Spark reads a bare number as milliseconds
            seconds = int(interval) / 1000 if interval.isdigit() else parse_duration("", interval)
            return seconds, int(conf.get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10") or "10")
        except (ConfigError, ValueError):
            return 60.0, 10

    def _checkpoint_final_snapshot(self) -> None:
        """Drained, or stopping with a savepoint, after this run processed batches: let the
        last checkpoint carry the RocksDB snapshot Spark uploads after its last commits
        (`Coordinator.checkpoint_final_snapshot`). Not after a failure, a cancel or SIGTERM;
        a control request arriving meanwhile ends the wait (nobody serves it during it)."""
        request = self.stop_request
        if (self.cfg.state_store != "rocksdb" or self.query_failed or self.error is not None or not self.batches
                or (self.stopping.is_set() and (request is None or request.kind == "cancel"))):
            return
        interval, min_deltas = self._snapshot_settings
        timeout = interval + 30.0 if self.cfg.final_snapshot_timeout_s is None else self.cfg.final_snapshot_timeout_s
        if request is not None:  # leave the savepoint half of the time the requester gives the stop
            timeout = min(timeout, (request.deadline - time.time()) / 2)
        next_look = [time.monotonic() + self.cfg.poll_interval_s]

        def cancelled() -> bool:
            if self.error is not None:
                return True
            if time.monotonic() < next_look[0]:
                return False
            next_look[0] = time.monotonic() + self.cfg.poll_interval_s
            try:
                return bool(self.control.pending(self.generation))
            except StorageError:
                return False

        self.coordinator.checkpoint_final_snapshot(min_deltas=min_deltas, timeout_s=timeout,
                                                   min_replay=self.cfg.final_snapshot_min_replay,
                                                   cancelled=cancelled)

    def _serve_control(self) -> None:
        """Serve the control requests addressed to this run's generation; on the first
        call, withdraw those left for older generations (their runs are gone)."""
        if self.error is not None:
            return  # terminating (e.g. SIGTERM): take on nothing new
        if not getattr(self, "_control_swept", False):
            withdrawn = self.control.withdraw_superseded(self.generation)
            if withdrawn:
                log.warning("job %s generation %d withdrew %d control request(s) addressed to earlier runs: %s",
                            self.cfg.job, self.generation, len(withdrawn), withdrawn)
            self._control_swept = True
        for request in self.control.pending(self.generation):
            try:
                self.control.acknowledge(request, self.generation)
            except ObjectExists:
                log.debug("control request %s was taken by another run", request.id)
                continue
            log.info("control request %s: %s", request.id, request.kind)
            if request.kind == "savepoint":
                try:
                    handle = self.coordinator.savepoint()
                    self.coordinator.commit_confirmed()
                except StaleGeneration:
                    raise
                except SparkpointError as exc:
                    self.control.fail(request, generation=self.generation, error=str(exc))
                    continue
                self.control.complete(request, generation=self.generation, savepoint=handle.uri,
                                      batch_id=handle.metadata.batch_id)
                self.savepoint_uri = handle.uri
            elif request.kind in ("stop", "cancel"):
                self.stop_request = request
                self.stopping.set()
                self._stop_query()
                return

    def _complete_stop(self) -> None:
        request = self.stop_request
        assert request is not None
        if request.kind == "cancel":
            self.control.complete(request, generation=self.generation,
                                  batch_id=self.coordinator.confirmed_batch)
            return
        try:
            handle = self.coordinator.savepoint()
        except SparkpointError as exc:
            self.control.fail(request, generation=self.generation, error=str(exc))
            raise
        self.savepoint_uri = handle.uri
        self.control.complete(request, generation=self.generation, savepoint=handle.uri,
                              batch_id=handle.metadata.batch_id)
        faults.maybe_kill("stopped", handle.metadata.batch_id)

    def _stop_query(self) -> None:
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:  # noqa: BLE001 - the query may already be gone
                log.debug("query.stop(): %s", exc)

    # -- status and result ----------------------------------------------------------------

    def _heartbeat(self) -> None:
        self._write_status("running")

    def _heartbeat_loop(self) -> None:
        while not self._heartbeat_stop.wait(self.cfg.poll_interval_s):
            self._heartbeat()

    def _write_status(self, state: str, error: str | None = None) -> None:
        coordinator: Coordinator | None = getattr(self, "coordinator", None)
        last = coordinator.last_checkpoint if coordinator is not None else None
        status = JobStatus(
            job=self.cfg.job, generation=self.generation, state=state, started_at=self.started_at,
            heartbeat_at=time.time(), last_batch=coordinator.confirmed_batch if coordinator is not None else None,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint_uri=self.catalog.checkpoint_uri(last.id) if last else None,
            checkpoints_completed=coordinator.checkpoints_completed if coordinator is not None else 0,
            savepoint_uri=self.savepoint_uri, error=error, host=socket.gethostname(), pid=os.getpid(),
            application_id=self._application_id,
        ).to_json()
        status["live_dir"] = getattr(self, "live", None)
        with self._status_lock:
            if self._final_state and state == "running":
                return  # a late heartbeat must not undo finished/stopped/failed
            if state != "running":
                self._final_state = True
            try:
                current = self.catalog.current_generation()
                if current != self.generation:
                    return  # a newer run owns the status record
                self.catalog.write_status(status)
            except StorageError as exc:
                log.warning("could not write the status of job %s: %s", self.cfg.job, exc)

    def _result(self, state: str) -> RunResult:
        last = self.coordinator.last_checkpoint
        return RunResult(
            status=state, job=self.cfg.job, generation=self.generation,
            batches_processed=len(self.batches), first_batch=min(self.batches) if self.batches else None,
            last_batch=self.coordinator.confirmed_batch,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint=self.catalog.checkpoint_uri(last.id) if last else None,
            savepoint=self.savepoint_uri,
            restored_from=self.plan.snapshot.uri if self.plan.snapshot else None,
            restore_mode="in-place" if self.choice.in_place else ("snapshot" if self.plan.snapshot else "empty"),
            checkpoints_completed=self.coordinator.checkpoints_completed,
            committed_batches=tuple(self.coordinator.batches_committed),
            recovered=self.recovered,
            live_dir=self.live,
            live_reuse=self.live_reuse.to_json(),
            rescaled=self.rescaled,
        )
