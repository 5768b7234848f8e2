"""`SparkpointJob`: a checkpointed Structured Streaming run in the Spark driver.

::

    job = SparkpointJob.get_or_create(app_name="orders")   # reads spark.sparkpoint.* conf
    result = job.run(df, sink=DeltaSink(job.arg("output")), output_mode="update")

or, in a job script, `SparkpointJob.main` around a function that does the same: it reports
the run's result (or its error) on the output and ends the process.

Threads in the driver: Spark's stream thread calls `_Run.stage_batch` through
``foreachBatch``; the commit watcher feeds committed batch ids to the coordinator thread,
which alone takes checkpoints, savepoints and commits, polls the control channel and
writes the heartbeat; the caller's thread waits for the query and for the coordinator.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import TransactionRecord
from airflow_sparkpoint.checkpoints.catalog_types import claim_details
from airflow_sparkpoint.checkpoints.history import generation_details
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.checkpoints.run_result import RunResult, error_line, result_line, write_run_result
from airflow_sparkpoint.exceptions import (
    ConfigError,
    SparkpointError,
    StaleGeneration,
)
from airflow_sparkpoint.runtime import cutover, follow, livedir, replay, rescale, signals, spark_support
from airflow_sparkpoint.runtime.commit_watch import (
    COMMIT_LISTING_INTERVAL_S,
    COMMIT_WATCH_INTERVAL_S,
    watch_commits,
)
from airflow_sparkpoint.runtime.config import PREFIX, SUBMITTER_ENV, SparkpointConfig
from airflow_sparkpoint.runtime.restore import (
    plan_restore,
)
from airflow_sparkpoint.runtime.run_coordination import RunCoordinator, state_store_settings
from airflow_sparkpoint.runtime.run_startup import RunStartup
from airflow_sparkpoint.runtime.run_state import RunState
from airflow_sparkpoint.runtime.run_status import StatusWriter
from airflow_sparkpoint.runtime.takeover import check_start
from airflow_sparkpoint.sinks.base import Sink, StageContext, settler

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["COMMIT_LISTING_INTERVAL_S", "COMMIT_WATCH_INTERVAL_S", "HDFS_PROVIDER", "ROCKSDB_PROVIDER",
           "TRACK_ROWS", "RunResult", "SparkpointJob", "watch_commits"]

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
            job = self
            if self.config.shadow is not None:  # zero-downtime blue-green: follow blue's batches
                taken = None if self.config.cutover is None else \
                    cutover.taken_over(follow.open_blue(self.config), self.config.cutover)
                if taken is None:
                    return self._run_shadow(df, sink, output_mode, query_name)
                # Green's task started again after green took the job over: the job is
                # green's, and this is a restart of it, not a warm-up.
                log.warning("cutover %s of job %s was taken over by generation %d: this start with the "
                            "cutover's shadow settings restarts the job (restore=latest) instead of warming "
                            "up", self.config.cutover, self.config.job, taken)
                restart = dataclasses.replace(self.config, shadow=None, restore="latest")
                job = SparkpointJob(self.spark, restart, self._argv)
            run = _Run(job, df, sink, output_mode, query_name)
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
        shadow = _Run(SparkpointJob(self.spark, shadowing.config, self._argv), df, shadowing.sink,
                      output_mode, query_name, shadowing=shadowing)
        # A shadow that hands over leaves this JVM's state stores open: closing them waits
        # for Spark's maintenance thread (seconds, all of it in the cutover's output gap).
        # The production run that follows closes every store at its end; the `finally`
        # below does on any other way out (a JVM that exits with RocksDB open may abort).
        shadow.state.close_state_stores = shadowing.handover is None
        try:
            with signals.sigterm_ends_run(shadow):
                self.last_result = result = shadow.execute()
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
        finally:
            if not shadow.state.close_state_stores:
                shadow.state.unload_state_stores()  # quick once the production run closed them


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
    """One execution of `SparkpointJob.run` (one generation): its state
    (`run_state.RunState`), run through its phases: the start-up (`run_startup`), the
    query and the staging of each batch (here), the coordinator thread
    (`run_coordination`), the status it reports (`run_status`). What SIGTERM asks of a
    run is `signals.Terminable`, which it implements."""

    def __init__(self, job: SparkpointJob, df: DataFrame, sink: Sink, output_mode: str,
                 name: str | None, *, shadowing: follow.Shadowing | None = None,
                 adopted: follow.Adopted | None = None) -> None:
        self.state = RunState(cfg=job.config, spark=job.spark, df=df, sink=sink, output_mode=output_mode,
                              query_name=name, application_id=job.spark.sparkContext.applicationId,
                              shadowing=shadowing, adopted=adopted)
        self.status = StatusWriter(self.state)
        self.startup = RunStartup(self.state, self.status)
        self.coordinator = RunCoordinator(self.state)
        self._watch_stop = threading.Event()
        #: the thread removing earlier runs' live locations, once the query started
        self._cleanup: threading.Thread | None = None

    def execute(self) -> RunResult:
        run = self.state
        self.startup.open()
        cfg = run.cfg
        # Never fence a live run another task started, unless asked to (before any write);
        # an adopted run's generation is claimed already (the cutover's handover).
        if run.adopted is None:
            check_start(run.catalog, AirflowTry.from_environ(), takeover=cfg.takeover,
                        cutover=cfg.cutover)
        # A read-only pre-check: bad input (a missing or foreign snapshot, damaged
        # checkpoints, a sink ahead) fails before anything is written (invariant 7).
        pre = plan_restore(cfg, run.catalog)
        self.startup.check_plan(pre)
        rescale.check_shuffle_partitions(dict(run.spark.sparkContext.getConf().getAll()),
                                         rescale.plan_rescale(cfg.restore_state_partitions, pre))
        faults.pause("after_plan", pre.batch_id)
        if run.adopted is not None:
            run.generation = run.adopted.generation
        else:
            run.generation = run.catalog.claim_generation(claim_details(
                restore=cfg.restore, plan=pre.description, app=run.application_id,
                # which submit this is (the Airflow operator finds its own run by it) and its UI
                submitter=os.environ.get(SUBMITTER_ENV, ""), ui=run.spark.sparkContext.uiWebUrl,
                **generation_details(cfg),  # config in force + Airflow try, for the history model
            )).generation
        try:
            self.startup.prepare()
        except BaseException as exc:
            if run.built_checkpointer is not None:
                run.built_checkpointer.close()
            self.status.write("failed", error=str(exc))
            run.release_live()
            raise
        return self._run_query()

    # -- what SIGTERM asks of a run (signals.Terminable) --------------------------------

    @property
    def error(self) -> BaseException | None:
        return self.state.error

    @error.setter
    def error(self, error: BaseException | None) -> None:
        self.state.error = error

    @property
    def stopping(self) -> threading.Event:
        return self.state.stopping

    @property
    def job_name(self) -> str:
        return self.state.cfg.job

    @property
    def claimed_generation(self) -> int | None:
        return self.state.claimed

    @property
    def query_started(self) -> bool:
        return self.state.query is not None

    def record_terminated(self, reason: str) -> bool:
        if self.state.built_checkpointer is None:  # the start-up's failure path records the status
            return False
        self.status.write("failed", error=reason)
        return True

    def stop_query(self) -> None:
        self.state.stop_query()

    # -- the query ----------------------------------------------------------------------

    def _run_query(self) -> RunResult:
        run = self.state
        coordinator_thread = threading.Thread(target=self.coordinator.run, name="sparkpoint-coordinator",
                                              daemon=True)
        # Its own thread, so a long final checkpoint or savepoint never looks like a dead job.
        heartbeat_thread = threading.Thread(target=self.status.heartbeat_loop, name="sparkpoint-heartbeat",
                                            daemon=True)
        try:
            # the JVM may be gone at the end
            self.coordinator.snapshot_settings = state_store_settings(run.spark)
            watched = (run.live, run.events, self._watch_stop, livedir.last_commit(run.live))
            watcher = threading.Thread(target=watch_commits, args=watched, name="sparkpoint-commits",
                                       daemon=True)
            query_error: BaseException | None = None
            if run.shadowing is not None:  # one query per batch of blue's, on this thread
                watcher.start()
                coordinator_thread.start()
                heartbeat_thread.start()
                query_error = self._follow(run.shadowing)
            else:
                writer = (
                    run.df.writeStream.outputMode(run.output_mode)
                    .foreachBatch(self.stage_batch)
                    .option("checkpointLocation", run.live)
                    .trigger(**run.cfg.trigger.spark_kwargs())
                )
                if run.query_name:
                    writer = writer.queryName(run.query_name)
                query = run.query = writer.start()
                self._cleanup = threading.Thread(target=self.remove_earlier_live, name="sparkpoint-cleanup",
                                                 daemon=True)
                self._cleanup.start()
                watcher.start()
                coordinator_thread.start()
                heartbeat_thread.start()
                try:
                    query.awaitTermination()
                except Exception as exc:  # noqa: BLE001 - re-raised below with context
                    query_error = exc
            # The watcher may not have seen the last commits yet: the coordinator's `finish`
            # confirms from commits/ itself, so they are not waited for here.
            run.query_failed = query_error is not None
            run.events.put(("final", None))
            coordinator_thread.join()
            return self.conclude(query_error)
        finally:
            self.status.heartbeat_stop.set()
            self._watch_stop.set()
            run.checkpointer.close()
            if run.close_state_stores:
                run.unload_state_stores()
            run.release_live()

    def _follow(self, shadowing: follow.Shadowing) -> BaseException | None:
        """Follow blue as its shadow (`follow.Follower`); return the error it ended with
        (a `SparkpointError` is the run's error as is, `conclude`)."""
        run = self.state
        try:
            follow.Follower(run, shadowing, stage=self.stage_batch).follow()
        except Exception as exc:  # noqa: BLE001 - the run ends with it
            if run.error is None and isinstance(exc, SparkpointError):
                run.error = exc
            return exc
        return None

    def remove_earlier_live(self) -> None:
        """Delete the live locations of earlier generations that no run holds, once the
        query runs on this one (no restore links from them any more): a run killed or
        failed before its end (`conclude`) left its own, a copy of the state each, and
        a job whose retries cannot resume in place would pile them up."""
        run = self.state
        try:
            removed = livedir.remove_unowned(run.work_root, run.live, run.generation)
        except OSError as exc:  # the next run's start, or this one's end, tries again
            log.warning("could not remove the live locations of earlier runs under %s: %s", run.work_root,
                        exc)
            return
        if removed:
            log.info("removed the live locations of earlier runs: %s", ", ".join(removed))

    def conclude(self, query_error: BaseException | None) -> RunResult:
        """Raise the run's failure, or record its result and return it."""
        run = self.state
        if run.error is not None:
            self.status.write("failed", error=str(run.error))
            if isinstance(run.error, SparkpointError):
                raise run.error
            raise SparkpointError(f"job {run.cfg.job!r} failed: {run.error}") from run.error
        if query_error is not None and not run.stopping.is_set():
            self.status.write("failed", error=str(query_error))
            raise SparkpointError(f"streaming query of job {run.cfg.job!r} failed: "
                                  f"{query_error}") from query_error
        state = "stopped" if run.stopping.is_set() else "finished"
        result = self.status.result(state)
        self.status.write(state)
        write_run_result(run.catalog, result)
        if self._cleanup is not None:
            self._cleanup.join()  # one pass at a time in this process (`livedir.remove_unowned`)
        livedir.remove_unowned(run.work_root, run.live, run.generation)
        log.info("job %s generation %d %s: %s", run.cfg.job, run.generation, state,
                 json.dumps(result.to_json()))
        return result

    def stage_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: stage the batch in the sink and record its pre-commit durably."""
        run = self.state
        with run.stage_lock:  # the stop_after rule: never a batch past N
            if run.stop_after is not None and batch_id > run.stop_after:
                run.stopping.set()
                raise _StopRun(f"job {run.cfg.job!r} stops after batch {run.stop_after}; batch {batch_id} "
                               "is not run")
            if run.highest_started is None or batch_id > run.highest_started:
                run.highest_started = int(batch_id)
        if run.stopping.is_set():
            raise _StopRun(f"job {run.cfg.job!r} is stopping; batch {batch_id} is not run")
        faults.pause("stage", batch_id, generation=run.generation)
        ctx = StageContext(run.cfg.job, int(batch_id), run.generation, run.cfg.storage_options,
                           run.cfg.driver_staging_max_bytes)
        payload = run.sink.stage(df, ctx)
        faults.maybe_kill("stage", batch_id)
        record = TransactionRecord(
            job=run.cfg.job, batch_id=int(batch_id), generation=run.generation, sink=run.sink.kind,
            sink_id=run.sink.sink_id, created_at=time.time(),
            # the commit keeps how to replay the batch (the self-healing fallback, runtime.replay)
            payload={"config": run.sink.to_config(), "staged": payload,
                     "replay": replay.capture(run.live, int(batch_id), run.cfg.code_version),
                     **settler(run.sink)},  # a subclass that settles differently: never the base
        )
        if run.stopping.is_set():
            run.sink.abort(record)
            raise _StopRun(f"job {run.cfg.job!r} is stopping; batch {batch_id} is discarded")
        try:
            # A superseded driver (a cleared try's, a stalled one) that staged after the
            # newer generation's recovery would leave its staging and record behind: it
            # takes its own staged data away and stops before recording anything.
            run.fence.check()
        except StaleGeneration as exc:
            run.sink.abort(record)
            if run.error is None:
                run.error = exc  # the run ends with it, not with Spark's wrapper of it
            raise
        run.catalog.put_transaction(record)
        run.committer.add_pending(record)
        run.batches_staged += 1
        run.first_batch = int(batch_id) if run.first_batch is None else min(run.first_batch, int(batch_id))
        faults.maybe_kill("record", batch_id)
        faults.pause("recorded", batch_id)
        if run.stopping.is_set():
            # A stop taken while this batch ran: fail it, so Spark never commits it and the
            # stop aborts it (whether Spark's own stop would still commit it is a race).
            raise _StopRun(f"job {run.cfg.job!r} is stopping; batch {batch_id} is discarded")
