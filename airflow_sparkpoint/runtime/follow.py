"""Shadow follow mode: green warms up beside blue on blue's own batches (#49).

A run with ``spark.sparkpoint.shadow.mode`` set (green: the new code, started with
blue's production arguments) does not plan batches of its own. It

1. refuses up front (before anything is written) a warm-up that cannot be exact: blue's
   checkpoint K (``shadow.from``) missing, or a source of K that cannot be read twice (the
   counter offsets of the rate, socket and memory sources, `replay.counter_source`);
2. restores K as a run of the *shadow job* in the shadow's own catalog
   (``shadow.dir``/``shadow.job``, ``restore.allowForeignJob``), as the pre-flight drill
   does; it claims only that catalog's generations;
3. follows blue batch by batch: for b = K+1.. it reads blue's replay record of b (the
   commit in blue's sink, or, before blue committed b, blue's pending transaction record
   ``txn/<b>-g<g>``), checks the offsets chain from K (each record's ``prev`` is the sha256
   of the previous batch's offsets), writes the batch into its live location and lets
   Spark run exactly that batch (`replay.run_batch`: same offsets, same
   ``batchWatermarkMs``/``batchTimestampMs`` from blue's offset log entry) with the user's
   query, whose sink is a `ShadowSink` (nothing visible anywhere); the shadow's
   coordinator checkpoints each batch into the scratch catalog as a normal run does;
4. after each batch writes its progress (`checkpoints.follow_record`, ``follow.json`` in
   the shadow's root): last replayed batch, blue's newest batch, seconds per batch;
5. verifies, once blue committed a batch the shadow replayed from a pending record, that
   the committed record is the one replayed (blue re-planned it after a failure:
   *diverged*, the run fails); compare mode compares the rows (`follow_compare`);
6. ends after ``shadow.untilBatch``, or when blue no longer runs and every batch it
   recorded was replayed.

It reads blue's catalog and sink and never writes them: no generation, transaction,
status or output of blue's job. Output through blue's last batch is blue's; state from
K on is green's code applied to the same input.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.follow_record import FollowProgress, write_follow
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, SparkpointError, StorageError
from airflow_sparkpoint.runtime import follow_compare, livedir, replay
from airflow_sparkpoint.runtime.config import PREFIX, Shadow, SparkpointConfig, work_root
from airflow_sparkpoint.runtime.job import SparkpointJob, _Run
from airflow_sparkpoint.sinks.base import Sink, replay_of
from airflow_sparkpoint.sinks.shadow import ShadowSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_sparkpoint.checkpoints.run_result import RunResult

__all__ = ["BLUE_ALIVE_S", "BlueJob", "shadow_config", "shadow_run"]

log = logging.getLogger(__name__)

#: blue counts as running while its status is running and its heartbeat younger than this
BLUE_ALIVE_S = 60.0
#: seconds per batch is the mean over this many newest batches
_RATE_WINDOW = 10


class BlueJob:
    """Blue's job, read only: its catalog (checkpoints, pending transactions, status) and
    its sink (committed replay records)."""

    def __init__(self, catalog: Catalog, sink: Sink) -> None:
        self.catalog = catalog
        self.sink = sink
        self.job = catalog.job

    def warmup_point(self, source: str) -> SnapshotHandle:
        """Blue's checkpoint the warm-up restores: its newest (``latest``) or the one
        `source` names.

        :raises ConfigError: blue has none, or `source` is not a snapshot of blue's job.
        """
        if source == "latest":
            meta = self.catalog.latest()
            if meta is None:
                raise ConfigError(f"{PREFIX}shadow.from=latest: job {self.job!r} in {self.catalog.uri} "
                                  "has no completed checkpoint to warm up from; expected blue to have "
                                  "checkpointed")
            return self.catalog.handle(meta)
        handle = self.catalog.own_snapshot(source)
        if handle is None:
            raise ConfigError(f"{PREFIX}shadow.from={source!r} is not a completed checkpoint or savepoint "
                              f"of job {self.job!r} in {self.catalog.uri}; expected latest or one of its "
                              "snapshots")
        return handle

    def committed_record(self, batch: int) -> dict[str, Any] | None:
        """The decoded replay record blue's sink keeps with its commit of `batch`, or None
        (not committed yet).

        :raises SparkpointError: the commit carries no usable record."""
        raw = self.sink.replay_record(self.job, batch)
        if raw is None:
            return None
        return _decoded(raw, batch, f"blue's commit of batch {batch} in {self.sink.sink_id}")

    def pending_record(self, batch: int) -> dict[str, Any] | None:
        """The decoded replay record of blue's newest pending transaction of `batch`
        (staged, not committed yet), or None.

        :raises SparkpointError: the record carries no usable replay record."""
        generations = [g for b, g in self.catalog.transaction_keys() if b == batch]
        for generation in sorted(generations, reverse=True):
            try:
                record = self.catalog.transaction_log.get(batch, generation)
            except CorruptRecord as exc:
                raise SparkpointError(f"blue's pending transaction of batch {batch} is unreadable: "
                                      f"{exc}") from None
            if record is None:
                continue  # settled meanwhile: the caller looks at the sink again
            raw = replay_of(record)
            if raw is None:
                raise SparkpointError(f"blue's pending transaction {record.txn_id} carries no replay "
                                      "record (an earlier release): the shadow cannot replay its batch")
            return _decoded(raw, batch, f"blue's pending transaction {record.txn_id}")
        return None

    def record(self, batch: int) -> tuple[dict[str, Any], bool] | None:
        """(blue's record of `batch`, whether it is committed), or None when blue has not
        staged it yet. The sink is read again after the pending records: a commit between
        the two reads settles (deletes) the pending one."""
        found = self.committed_record(batch)
        if found is not None:
            return found, True
        pending = self.pending_record(batch)
        if pending is not None:
            return pending, False
        found = self.committed_record(batch)
        return (found, True) if found is not None else None

    def status(self) -> tuple[bool, int | None]:
        """(whether blue runs, its newest committed batch per its status)."""
        status = read_job_status(self.catalog)
        if status is None:
            return False, None
        return status.is_alive(BLUE_ALIVE_S), status.last_batch


def _decoded(raw: str, batch: int, where: str) -> dict[str, Any]:
    body = replay.decode(raw)
    if isinstance(body, str):
        raise SparkpointError(f"{where} cannot be replayed: {body}")
    if body.get("batch") != batch:
        raise SparkpointError(f"{where} names batch {body.get('batch')}, not {batch}")
    return dict(body)


def shadow_config(cfg: SparkpointConfig, start: SnapshotHandle) -> SparkpointConfig:
    """The settings of the shadow run: blue's, in the shadow's own root and job, restoring
    blue's checkpoint `start` as a foreign snapshot; checkpoint every batch, commit mode
    checkpoint (the shadow sink commits nothing), no final RocksDB snapshot wait (the
    shadow's next run restores it or green adopts it)."""
    shadow = cfg.shadow
    assert shadow is not None
    return dataclasses.replace(
        cfg, dir=shadow.dir, job=shadow.job, work_dir=shadow.work_dir, restore=start.uri,
        restore_allow_foreign_job=True, restore_force=False, restore_sink_ahead="fail", takeover=False,
        checkpoint_interval_s=0.0, commit_mode="checkpoint", final_snapshot_timeout_s=0.0, shadow=None)


def shadow_run(job: SparkpointJob, df: DataFrame, sink: Sink, output_mode: str,
               query_name: str | None) -> _Run:
    """The run that follows blue as its shadow (the module docstring); its `execute`
    returns the shadow run's result and raises what `_Run.execute` raises, and:

    :raises ConfigError: (here) a warm-up that cannot be exact, before anything is written.
    :raises SparkpointError: (execute) blue diverged from what the shadow replayed, a
        record is unusable, or the shadow's run failed.
    """
    cfg = job.config
    shadow = cfg.shadow
    assert shadow is not None
    try:
        blue_catalog = Catalog.open(cfg.dir, cfg.job, **cfg.storage_options)
    except (StorageError, ValueError) as exc:
        raise ConfigError(f"{PREFIX}dir={cfg.dir!r} (blue's store) cannot be opened: {exc}") from exc
    sink.configure(cfg.storage_options)
    if shadow.mode == "compare":
        follow_compare.check_comparable(sink)
    blue = BlueJob(blue_catalog, sink)
    start = blue.warmup_point(shadow.source)
    _check_followable(start)
    scratch = shadow_config(cfg, start)
    compare_dir = None
    if shadow.mode == "compare":
        compare_dir = f"{work_root(scratch.dir, scratch.job, scratch.work_dir)}/compare"
    shadow_job = SparkpointJob(job.spark, scratch, job._argv)
    return _FollowRun(shadow_job, df, ShadowSink(shadow.mode, compare_dir), output_mode, query_name,
                      blue=blue, shadow=shadow, start=start, user_sink=sink)


def _check_followable(start: SnapshotHandle) -> None:
    """Refuse a warm-up from `start` whose sources cannot be read twice.

    :raises ConfigError: naming the source and why."""
    batch = start.metadata.batch_id
    try:
        offsets = replay.snapshot_offsets(start)
    except (SparkpointError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the offsets of {start.uri} cannot be read ({exc}); a shadow needs them") from None
    if offsets is None:
        raise ConfigError(f"{start.uri} holds no offsets/{batch}: a shadow cannot follow from it")
    why = replay.counter_source(offsets, batch)
    if why is not None:
        raise ConfigError(f"job {start.metadata.job!r} cannot be followed by a shadow from {start.uri}: "
                          f"{why}. "
                          "Zero-downtime blue-green needs sources that can be read twice (file sources "
                          "without cleanSource, Kafka within retention); use the stop-savepoint-start path")


class _FollowRun(_Run):
    """A run of the shadow job whose batches are blue's (the module docstring)."""

    def __init__(self, job: SparkpointJob, df: DataFrame, sink: ShadowSink, output_mode: str,
                 name: str | None, *, blue: BlueJob, shadow: Shadow, start: SnapshotHandle,
                 user_sink: Sink) -> None:
        super().__init__(job, df, sink, output_mode, name)
        self.blue = blue
        self.shadow = shadow
        self.start = start
        self.user_sink = user_sink
        self.shadow_sink = sink
        self._durations: collections.deque[float] = collections.deque(maxlen=_RATE_WINDOW)
        #: batches replayed from a pending record of blue, by the sha of their offsets
        self._unverified: dict[int, str] = {}
        #: compare mode: replayed batches not compared with blue's commit yet, in order
        self._uncompared: list[int] = []
        self._compared_through: int | None = None
        self.progress: FollowProgress | None = None

    def _run_query(self) -> RunResult:
        coordinator_thread = threading.Thread(target=self._coordinate, name="sparkpoint-coordinator",
                                              daemon=True)
        heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="sparkpoint-heartbeat",
                                            daemon=True)
        try:
            self._snapshot_settings = self._state_store_settings()
            watcher = threading.Thread(target=self._watch_commits, args=(livedir.last_commit(self.live),),
                                       name="sparkpoint-commits", daemon=True)
            watcher.start()
            coordinator_thread.start()
            heartbeat_thread.start()
            failure: BaseException | None = None
            try:
                self._follow()
            except Exception as exc:  # noqa: BLE001 - the run ends with it (`_conclude`)
                failure = exc
                if self.error is None and isinstance(exc, SparkpointError):
                    self.error = exc
                self._report(state="failed", error=str(exc))
            self.query_failed = failure is not None
            self.events.put(("final", None))
            coordinator_thread.join()
            return self._conclude(failure)
        finally:
            self._heartbeat_stop.set()
            self._watch_stop.set()
            self.checkpointer.close()
            self._release_live()

    # -- following ------------------------------------------------------------------------

    def _follow(self) -> None:
        restart = self.plan.batch_id
        offsets = livedir.read_log_file(self.live, f"offsets/{restart}") if restart is not None else None
        if restart is None or offsets is None:
            raise SparkpointError(f"the shadow's live location {self.live} holds no offsets of its "
                                  "restart point")
        prev = replay.sha(offsets)
        batch = restart + 1
        self._report(state="following")
        while not self.stopping.is_set() and self.error is None:
            self._verify_committed()
            self._compare_committed()
            if self.shadow.until_batch is not None and batch > self.shadow.until_batch:
                break
            found = self.blue.record(batch)
            if found is None:
                running, _last = self.blue.status()
                if not running and self.blue.record(batch) is None:
                    break  # blue ended: everything it recorded is replayed
                self._report(state="caught_up")
                self.stopping.wait(self.shadow.poll_interval_s)
                continue
            body, committed = found
            if body.get("prev") != prev:
                raise SparkpointError(
                    f"blue's batch {batch} does not continue the batches the shadow replayed from "
                    f"{self.start.uri} (its previous offsets differ): blue re-planned from another point; "
                    "the shadow diverged and must start again")
            why = replay.sources_replayable(body, batch, restart)
            if why is not None:
                raise SparkpointError(f"the shadow cannot replay blue's batch {batch}: {why}")
            self._replay(body)
            prev = replay.sha(body["offsets"])
            if not committed:
                self._unverified[batch] = prev
            if self.shadow.mode == "compare":
                self._uncompared.append(batch)
            self._report(state="following")
            batch += 1
        self._verify_committed(final=True)
        self._compare_committed()
        self._report(state="ended")

    def _replay(self, body: Mapping[str, Any]) -> None:
        batch = int(body["batch"])
        self.fence.check()
        faults.pause("shadow_replay", batch, generation=self.generation)
        began = time.monotonic()
        replay.write_batch(self.live, body)

        def started(query: Any) -> None:
            self.query = query
            if self.stopping.is_set():
                self.stop_query()

        replay.run_batch(self.spark, self.df, self.output_mode, self.live, batch, stage=self._stage_batch,
                         started=started)
        self._durations.append(time.monotonic() - began)
        faults.maybe_kill("shadow_replay", batch)
        log.info("shadow %s replayed blue's batch %d in %.2f s", self.cfg.job, batch, self._durations[-1])

    def _verify_committed(self, final: bool = False) -> None:
        """Check the batches replayed from blue's pending records against blue's commits
        (`final`: blue ended, every one must be committed).

        :raises SparkpointError: a commit holds other offsets (diverged), or (final) blue
            never committed a batch the shadow replayed."""
        for batch, digest in sorted(self._unverified.items()):
            body = self.blue.committed_record(batch)
            if body is None:
                if final:
                    raise SparkpointError(
                        f"the shadow replayed blue's batch {batch} from its pending transaction, and blue "
                        "ended without committing it: the shadow's state is ahead of blue's output")
                return  # batches commit in order
            if replay.sha(body["offsets"]) != digest:
                raise SparkpointError(
                    f"blue committed batch {batch} with other offsets than the pending record the shadow "
                    "replayed (blue re-planned it after a failure): the shadow diverged and must start again")
            del self._unverified[batch]

    def _compare_committed(self) -> None:
        """Compare the replayed batches blue has committed since, oldest first.

        :raises SparkpointError: green's rows of a batch differ from blue's (the first
            differing rows named; also in the progress record)."""
        while self._uncompared:
            batch = self._uncompared[0]
            if self.blue.committed_record(batch) is None:
                return  # not committed yet: batches commit in order
            path = self.shadow_sink.batch_dir(self.cfg.job, batch)
            green = self.spark.read.parquet(path) if os.path.isdir(path) else None
            found = follow_compare.difference(
                green, follow_compare.blue_rows(self.spark, self.user_sink, self.blue.job, batch), batch)
            if found is not None:
                self._difference = found
                raise SparkpointError(f"the shadow's output differs from what blue committed: {found}")
            self._compared_through = batch
            self._uncompared.pop(0)

    _difference: str | None = None

    def _report(self, *, state: str, error: str | None = None) -> None:
        """Write the progress record; never fails the run (it is read by others only)."""
        try:
            _running, blue_last = self.blue.status()
            last = livedir.last_commit(self.live)
            replayed = last if last is not None else self.start.metadata.batch_id
            verified = min(self._unverified, default=replayed + 1) - 1
            rate = sum(self._durations) / len(self._durations) if self._durations else None
            if self.progress is None:
                self.progress = FollowProgress(
                    shadow_job=self.cfg.job, blue_job=self.blue.job, mode=self.shadow.mode, state=state,
                    started_from=self.start.uri, started_batch=self.start.metadata.batch_id,
                    last_replayed=replayed, blue_last_batch=blue_last, seconds_per_batch=rate,
                    verified_through=verified, compared_through=self._compared_through,
                    difference=self._difference, error=error)
            else:
                self.progress = self.progress.with_(state=state, last_replayed=replayed,
                                                    blue_last_batch=blue_last, seconds_per_batch=rate,
                                                    verified_through=verified,
                                                    compared_through=self._compared_through,
                                                    difference=self._difference, error=error)
            write_follow(self.catalog.store, self.progress)
        except (SparkpointError, OSError) as exc:
            log.warning("shadow %s: could not write its progress record: %s", self.cfg.job, exc)
