"""`SparkpointJob`: a checkpointed Structured Streaming run in the Spark driver.

::

    job = SparkpointJob.get_or_create(app_name="orders")   # reads spark.sparkpoint.* conf
    result = job.run(df, sink=DeltaSink(job.arg("output")), output_mode="update")

or, in a job script, `SparkpointJob.main` around a function that does the same: it reports
the run's result (or its error) on the output and ends the process.

Threads in the driver: Spark's stream thread calls `_stage_batch` through
``foreachBatch``; the commit watcher feeds committed batch ids to the coordinator thread,
which alone takes checkpoints, savepoints and commits, polls the control channel and
writes the heartbeat; the caller's thread waits for the query and for the coordinator.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import TransactionRecord
from airflow_sparkpoint.checkpoints.catalog_types import claim_details
from airflow_sparkpoint.checkpoints.control import ControlRequest
from airflow_sparkpoint.checkpoints.history import generation_details
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.checkpoints.run_result import RunResult, error_line, result_line, write_run_result
from airflow_sparkpoint.exceptions import (
    ConfigError,
    SparkpointError,
    StaleGeneration,
)
from airflow_sparkpoint.runtime import follow, livedir, replay, rescale, signals, spark_support
from airflow_sparkpoint.runtime.config import PREFIX, SUBMITTER_ENV, SparkpointConfig
from airflow_sparkpoint.runtime.restore import (
    plan_restore,
)
from airflow_sparkpoint.runtime.run_coordination import _RunCoordination
from airflow_sparkpoint.runtime.takeover import check_start
from airflow_sparkpoint.sinks.base import Sink, StageContext, settler

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["COMMIT_LISTING_INTERVAL_S", "COMMIT_WATCH_INTERVAL_S", "HDFS_PROVIDER", "ROCKSDB_PROVIDER",
           "TRACK_ROWS", "RunResult", "SparkpointJob"]

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
_MISSING = object()
#: Spark's RocksDB provider looks every written key up first to count the rows in state
#: (``numRowsTotal``); a restart replays the changelog since the last RocksDB snapshot
#: through the same writes, so the count costs a restore about 2.5x its state load
#: (docs/BENCHMARKS.md, restore at 2,000,000 keys). Off unless the user sets it.
TRACK_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"


#: how often the commit watcher looks for Spark's next ``commits/<N>`` (one stat)
COMMIT_WATCH_INTERVAL_S = 0.05
#: how often it lists ``commits/`` whole
COMMIT_LISTING_INTERVAL_S = 2.0


class _StopRun(Exception):
    """Raised inside foreachBatch when a stop was requested: the batch must not record."""


@contextmanager
def _reported() -> Iterator[None]:
    """Print the error line (`run_result.error_line`) of an error raised inside, once, so
    that the operator shows the driver's own error as the task's (then re-raise it)."""
    try:
        yield
    except Exception as exc:
        if not getattr(exc, "_sparkpoint_reported", False):
            print(error_line(exc), file=sys.stderr, flush=True)
            try:
                exc._sparkpoint_reported = True  # type: ignore[attr-defined]
            except AttributeError:  # an exception type without a __dict__: reported again at worst
                pass
        raise


class SparkpointJob:
    """A PySpark pipeline with Flink-grade checkpoints (see the module docstring)."""

    def __init__(self, spark: SparkSession, config: SparkpointConfig,
                 argv: Sequence[str] | None = None) -> None:
        self.spark = spark
        self.config = config
        self._argv = list(sys.argv[1:] if argv is None else argv)
        self._args = _parse_args(self._argv)
        #: what the last `run` returned (None before one ended)
        self.last_result: RunResult | None = None

    @classmethod
    def main(
        cls,
        pipeline: Callable[[SparkpointJob], Any],
        app_name: str | None = None,
        *,
        conf: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
    ) -> NoReturn:
        """Run a job script: `get_or_create` the job, call ``pipeline(job)`` (which calls
        `run`), print the run's result line (``SPARKPOINT_RESULT {...}``,
        `run_result.result_line`) and end the process with exit code 0 at once, so that no
        library's teardown can fail a run that finished (`process_exit.exit_process`).
        Call it under ``if __name__ == "__main__":``::

            def orders(job: SparkpointJob) -> None:
                ...
                job.run(totals, sink=DeltaSink(job.arg("output")), output_mode="update")

            if __name__ == "__main__":
                SparkpointJob.main(orders, app_name="orders")

        On an error, its error line (``SPARKPOINT_ERROR {...}``: class and message, what
        `SparkpointSubmitOperator` raises as the task's error) is printed and the error
        is raised: the process exits non-zero with its traceback.
        """
        from airflow_sparkpoint.process_exit import exit_process

        job = cls.get_or_create(app_name, conf=conf, argv=argv)
        with _reported():
            returned = pipeline(job)
        result = returned if isinstance(returned, RunResult) else job.last_result
        if result is not None:
            print(result_line(result), flush=True)
        exit_process(0)

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

        :raises ConfigError: a setting is missing or invalid; a library of the runtime is
            missing; this Spark is outside the supported range or lacks a feature the
            settings ask for (`runtime.spark_support`).
        """
        with _reported():
            return cls._create(app_name, conf, argv)

    @classmethod
    def _create(cls, app_name: str | None, conf: Mapping[str, str] | None,
                argv: Sequence[str] | None) -> SparkpointJob:
        spark_support.check_runtime_libraries()  # before pyspark, whose import would fail first
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
        spark_support.check_spark_version(spark.version)
        spark_support.check_requested_features(
            {**settings,
             spark_support.CHECKPOINT_FORMAT_KEY:
                 spark.conf.get(spark_support.CHECKPOINT_FORMAT_KEY, "1") or "1"},
            spark.version)
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
        (``availableNow``) or a stop-with-savepoint request arrives; with
        ``spark.sparkpoint.shadow.mode`` set, follow blue's job as its shadow instead
        (`runtime.follow`: `sink` is only read).

        :raises ConfigError: bad arguments, before anything is written.
        :raises RestoreError: the restore target is unusable, or a sink is ahead of it.
        :raises SparkpointError: the query or the checkpointing failed (with the cause).
        """
        with _reported():  # the operator shows the error as the task's own
            if output_mode not in ("append", "update", "complete"):
                raise ConfigError(f"output_mode={output_mode!r} is not allowed; expected "
                                  "append, update or complete")
            if not isinstance(sink, Sink):
                raise ConfigError(f"sink={sink!r} is not a Sparkpoint sink; expected DeltaSink, S3Sink or "
                                  "DirectorySink")
            if not df.isStreaming:
                raise ConfigError("run() needs a streaming DataFrame (spark.readStream...); got a batch "
                                  "DataFrame")
            if self.config.shadow is not None:  # zero-downtime blue-green: follow blue's batches
                return self._run_shadow(df, sink, output_mode, query_name)
            run = _Run(self, df, sink, output_mode, query_name)
            with signals.sigterm_ends_run(run):  # a killed task: record the end, act no more
                self.last_result = run.execute()
        return self.last_result

    #: the zero-downtime cutover a shadow run belongs to (`follow.Handover`; None: with
    #: ``spark.sparkpoint.cutover`` set, `follow.prepare` builds that cutover's): the shadow
    #: then ends at the agreed batch N, takes blue's job over and goes on from N+1
    handover: follow.Handover | None = None

    def _run_shadow(self, df: DataFrame, sink: Sink, output_mode: str, query_name: str | None) -> RunResult:
        """Follow blue as its shadow (`runtime.follow`); with a `handover`, then take the
        job over at N and run it as the production job from N+1 into `sink`."""
        shadowing = follow.prepare(self.config, sink, self.handover)  # reads only; refuses bad input
        run = _Run(SparkpointJob(self.spark, shadowing.config, self._argv), df, shadowing.sink, output_mode,
                   query_name, shadowing=shadowing)
        with signals.sigterm_ends_run(run):
            self.last_result = result = run.execute()
        if shadowing.handover is None or result.status != "finished":
            return result  # a plain warm-up, or a shadow stopped by request: no takeover
        agreed = shadowing.handover.agreed_batch()
        reached = livedir.last_commit(result.live_dir)  # the warm-up may have started at N itself
        if reached is None or reached != agreed:
            raise SparkpointError(f"the shadow's live location {result.live_dir} is at batch {reached}, "
                                  f"not at the cutover's batch {agreed}; green does not take over")
        generation = shadowing.handover.adopt(result.live_dir, result.last_checkpoint)
        adopted = follow.Adopted(generation, reached, result.live_dir)
        settings = dataclasses.replace(self.config, shadow=None, restore="latest")
        production = SparkpointJob(self.spark, settings, self._argv)
        run = _Run(production, df, sink, output_mode, query_name, adopted=adopted)
        with signals.sigterm_ends_run(run):
            self.last_result = run.execute()
        return self.last_result


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


class _Run(_RunCoordination):
    """One execution of `SparkpointJob.run` (one generation): its state, start-up,
    coordinator thread and status come from the layers in `run_status`, `run_startup`
    and `run_coordination`; the query and the staging of each batch are here."""

    #: the thread removing earlier runs' live locations, once the query started
    _cleanup: threading.Thread | None = None

    def __init__(self, job: SparkpointJob, df: DataFrame, sink: Sink, output_mode: str,
                 name: str | None, *, shadowing: follow.Shadowing | None = None,
                 adopted: follow.Adopted | None = None) -> None:
        self.job = job
        #: a shadow run: it follows blue's batches instead of planning its own (`runtime.follow`)
        self.shadowing = shadowing
        self.adopted = adopted  # its generation is claimed already
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
        self.batches_staged = 0  # foreachBatch calls
        self.first_batch: int | None = None  # the lowest batch id staged
        self.savepoint_uri: str | None = None
        self.stop_request: ControlRequest | None = None
        # A stop_after request in force (`run_coordination`): no batch past it is staged; the
        # highest batch foreachBatch was entered for, under the lock both share.
        self.stop_after: int | None = None
        self.highest_started: int | None = None
        self._stage_lock = threading.Lock()
        self.query_failed = False  # the streaming query ended with an error
        self._snapshot_settings = (60.0, 10)  # Spark's, read when the query starts
        self.started_at = time.time()
        self._status_lock = threading.Lock()
        self._final_state = False
        self._heartbeat_stop = threading.Event()
        self._watch_stop = threading.Event()
        # The coordinator thread's housekeeping (`run_coordination`): when it next runs (monotonic).
        self._control_tidy_at = 0.0
        self._heap_trim_at = 0.0
        self._application_id = self.spark.sparkContext.applicationId  # asked once: a JVM call

    def execute(self) -> RunResult:
        self._open()
        cfg = self.cfg
        # Never fence a live run another task started, unless asked to (before any write);
        # an adopted run's generation is claimed already (the cutover's handover).
        if self.adopted is None:
            check_start(self.catalog, AirflowTry.from_environ(), takeover=cfg.takeover,
                        cutover=cfg.cutover)
        # A read-only pre-check: bad input (a missing or foreign snapshot, damaged
        # checkpoints, a sink ahead) fails before anything is written (invariant 7).
        pre = plan_restore(cfg, self.catalog)
        self._check_plan(pre)
        rescale.check_shuffle_partitions(dict(self.spark.sparkContext.getConf().getAll()),
                                         rescale.plan_rescale(cfg.restore_state_partitions, pre))
        faults.pause("after_plan", pre.batch_id)
        if self.adopted is not None:
            self.generation = self.adopted.generation
        else:
            self.generation = self.catalog.claim_generation(claim_details(
                restore=cfg.restore, plan=pre.description, app=self._application_id,
                # which submit this is (the Airflow operator finds its own run by it) and its UI
                submitter=os.environ.get(SUBMITTER_ENV, ""), ui=self.spark.sparkContext.uiWebUrl,
                **generation_details(cfg),  # config in force + Airflow try, for the history model
            )).generation
        try:
            self._prepare()
        except BaseException as exc:
            if self._checkpointer is not None:
                self._checkpointer.close()
            self._write_status("failed", error=str(exc))
            self._release_live()
            raise
        return self._run_query()

    # -- what SIGTERM asks of a run (signals.Terminable) --------------------------------

    @property
    def job_name(self) -> str:
        return self.cfg.job

    @property
    def claimed_generation(self) -> int | None:
        return self._generation

    @property
    def query_started(self) -> bool:
        return self.query is not None

    def record_terminated(self, reason: str) -> bool:
        if self._checkpointer is None:  # the start-up's failure path records the status
            return False
        self._write_status("failed", error=reason)
        return True

    # -- the query ----------------------------------------------------------------------

    def _run_query(self) -> RunResult:
        coordinator_thread = threading.Thread(target=self._coordinate, name="sparkpoint-coordinator",
                                              daemon=True)
        # Its own thread, so a long final checkpoint or savepoint never looks like a dead job.
        heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="sparkpoint-heartbeat",
                                            daemon=True)
        try:
            self._snapshot_settings = self._state_store_settings()  # the JVM may be gone at the end
            watcher = threading.Thread(target=self._watch_commits, args=(livedir.last_commit(self.live),),
                                       name="sparkpoint-commits", daemon=True)
            query_error: BaseException | None = None
            if self.shadowing is not None:  # one query per batch of blue's, on this thread
                watcher.start()
                coordinator_thread.start()
                heartbeat_thread.start()
                query_error = self._follow(self.shadowing)
            else:
                writer = (
                    self.df.writeStream.outputMode(self.output_mode)
                    .foreachBatch(self._stage_batch)
                    .option("checkpointLocation", self.live)
                    .trigger(**self.cfg.trigger.spark_kwargs())
                )
                if self.query_name:
                    writer = writer.queryName(self.query_name)
                self.query = writer.start()
                self._cleanup = threading.Thread(target=self._remove_earlier_live, name="sparkpoint-cleanup",
                                                 daemon=True)
                self._cleanup.start()
                watcher.start()
                coordinator_thread.start()
                heartbeat_thread.start()
                try:
                    self.query.awaitTermination()
                except Exception as exc:  # noqa: BLE001 - re-raised below with context
                    query_error = exc
            # The watcher may not have seen the last commits yet: `_finish` confirms
            # from commits/ itself, so they are not waited for here.
            self.query_failed = query_error is not None
            self.events.put(("final", None))
            coordinator_thread.join()
            return self._conclude(query_error)
        finally:
            self._heartbeat_stop.set()
            self._watch_stop.set()
            self.checkpointer.close()
            self._release_live()

    def _follow(self, shadowing: follow.Shadowing) -> BaseException | None:
        """Follow blue as its shadow (`follow.Follower`); return the error it ended with
        (a `SparkpointError` is the run's error as is, `_conclude`)."""
        try:
            follow.Follower(self, shadowing).follow()
        except Exception as exc:  # noqa: BLE001 - the run ends with it
            if self.error is None and isinstance(exc, SparkpointError):
                self.error = exc
            return exc
        return None

    def stage_batch(self, df: DataFrame, batch_id: int) -> None:
        """`_stage_batch`, for the follower (`follow.FollowedRun`)."""
        self._stage_batch(df, batch_id)

    def _remove_earlier_live(self) -> None:
        """Delete the live locations of earlier generations that no run holds, once the
        query runs on this one (no restore links from them any more): a run killed or
        failed before its end (`_conclude`) left its own, a copy of the state each, and
        a job whose retries cannot resume in place would pile them up."""
        try:
            removed = livedir.remove_unowned(self.work_root, self.live, self.generation)
        except OSError as exc:  # the next run's start, or this one's end, tries again
            log.warning("could not remove the live locations of earlier runs under %s: %s", self.work_root,
                        exc)
            return
        if removed:
            log.info("removed the live locations of earlier runs: %s", ", ".join(removed))

    def _watch_commits(self, seen: int | None) -> None:
        """Feed the coordinator each batch Spark commits (its ``commits/<N>`` file, written
        atomically), in order, from the batch after `seen` (the restored restart point).

        Not a streaming query listener: PySpark converts every progress event into Python
        with one JVM call per field (every source, state operator and metric): 30 ms of
        Python and 130 ms of JVM CPU per batch here (docs/BENCHMARKS.md), for a batch id
        that the commit log has first. A stat of the next ``commits/`` file per
        `COMMIT_WATCH_INTERVAL_S`; a full listing now and then in case one was skipped."""
        next_listing = time.monotonic() + COMMIT_LISTING_INTERVAL_S
        while not self._watch_stop.wait(COMMIT_WATCH_INTERVAL_S):
            if time.monotonic() >= next_listing:  # the listing holds whatever the stats would find
                next_listing = time.monotonic() + COMMIT_LISTING_INTERVAL_S
                found = [b for b in livedir.committed_batches(self.live) if seen is None or b > seen]
            else:
                found = []
                batch = 0 if seen is None else seen + 1
                while livedir.is_committed(self.live, batch):
                    found.append(batch)
                    batch += 1
            for batch in found:
                self.events.put(("progress", batch))
            if found:
                seen = found[-1]

    def _conclude(self, query_error: BaseException | None) -> RunResult:
        """Raise the run's failure, or record its result and return it."""
        if self.error is not None:
            self._write_status("failed", error=str(self.error))
            if isinstance(self.error, SparkpointError):
                raise self.error
            raise SparkpointError(f"job {self.cfg.job!r} failed: {self.error}") from self.error
        if query_error is not None and not self.stopping.is_set():
            self._write_status("failed", error=str(query_error))
            raise SparkpointError(f"streaming query of job {self.cfg.job!r} failed: "
                                  f"{query_error}") from query_error
        state = "stopped" if self.stopping.is_set() else "finished"
        result = self._result(state)
        self._write_status(state)
        write_run_result(self.catalog, result)
        if self._cleanup is not None:
            self._cleanup.join()  # one pass at a time in this process (`livedir.remove_unowned`)
        livedir.remove_unowned(self.work_root, self.live, self.generation)
        log.info("job %s generation %d %s: %s", self.cfg.job, self.generation, state,
                 json.dumps(result.to_json()))
        return result

    def _stage_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: stage the batch in the sink and record its pre-commit durably."""
        with self._stage_lock:  # the stop_after rule: never a batch past N
            if self.stop_after is not None and batch_id > self.stop_after:
                self.stopping.set()
                raise _StopRun(f"job {self.cfg.job!r} stops after batch {self.stop_after}; batch {batch_id} "
                               "is not run")
            if self.highest_started is None or batch_id > self.highest_started:
                self.highest_started = int(batch_id)
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
                     "replay": replay.capture(self.live, int(batch_id), self.cfg.code_version),
                     **settler(self.sink)},  # a subclass that settles differently: never the base
        )
        if self.stopping.is_set():
            self.sink.abort(record)
            raise _StopRun(f"job {self.cfg.job!r} is stopping; batch {batch_id} is discarded")
        try:
            # A superseded driver (a cleared try's, a stalled one) that staged after the
            # newer generation's recovery would leave its staging and record behind: it
            # takes its own staged data away and stops before recording anything.
            self.fence.check()
        except StaleGeneration as exc:
            self.sink.abort(record)
            if self.error is None:
                self.error = exc  # the run ends with it, not with Spark's wrapper of it
            raise
        self.catalog.put_transaction(record)
        self.committer.add_pending(record)
        self.batches_staged += 1
        self.first_batch = int(batch_id) if self.first_batch is None else min(self.first_batch, int(batch_id))
        faults.maybe_kill("record", batch_id)
        faults.pause("recorded", batch_id)
        if self.stopping.is_set():
            # A stop taken while this batch ran: fail it, so Spark never commits it and the
            # stop aborts it (whether Spark's own stop would still commit it is a race).
            raise _StopRun(f"job {self.cfg.job!r} is stopping; batch {batch_id} is discarded")
