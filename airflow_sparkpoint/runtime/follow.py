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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.follow_record import FollowProgress, write_follow
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, SparkpointError, StorageError
from airflow_sparkpoint.runtime import follow_compare, livedir, replay
from airflow_sparkpoint.runtime.config import PREFIX, Shadow, SparkpointConfig, work_root
from airflow_sparkpoint.runtime.cutover import CutoverHandover
from airflow_sparkpoint.sinks.base import Sink, replay_of
from airflow_sparkpoint.sinks.shadow import ShadowSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from airflow_sparkpoint.checkpoints.generations import Fence
    from airflow_sparkpoint.runtime.restore_plan import RestorePlan

__all__ = ["BLUE_ALIVE_S", "Adopted", "BlueJob", "FollowedRun", "Follower", "Handover", "Shadowing",
           "open_blue", "prepare", "shadow_config"]

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


class Handover(Protocol):
    """The zero-downtime cutover a warm-up belongs to, as the follower needs it. Its
    records (``cutover/<cid>.*`` under blue's job: the plan, green's progress, the agreed
    batch N, the claim) and green's claim and adoption are the cutover's own modules';
    an adapter over them implements this (docs/howto/blue-green.md)."""

    def report(self, progress: FollowProgress, shadow_generation: int) -> None:
        """Publish green's progress where the orchestrator reads it (``<cid>.green.json``)."""

    def agreed_batch(self) -> int | None:
        """The agreed batch N, once agreed (None before).

        :raises SparkpointError: the cutover was called off or ended."""

    def blue_stopped(self) -> bool:
        """Whether blue completed its stop after N at N (False while it is pending).

        :raises SparkpointError: blue's stop failed, or ended at another batch."""

    def adopt(self, live_dir: str, adopted_from: str | None) -> int:
        """Green's claim of blue's job (blue's generation + 1, fencing blue) and the origin
        of its lineage (base: blue's final checkpoint at N; `live_dir`: green's live
        location at N; `adopted_from`: green's shadow checkpoint at N); return the
        generation claimed.

        :raises SparkpointError: the claim was refused (another start took the
            generation, the cutover ended, blue's sink is not at N); nothing is adopted."""


@dataclass(frozen=True)
class Adopted:
    """Green took blue's job over at batch `batch_id` as generation `generation`; its live
    location `live_dir` holds green's state at that batch (`runtime.job._Run` continues
    there: an adoption checkpoint, then batch N+1 into the production sink)."""

    generation: int
    batch_id: int
    live_dir: str


@dataclass(frozen=True)
class Shadowing:
    """What a shadow run needs, prepared by `prepare` before anything is written: its own
    settings (`config`), the sink it writes (`sink`), blue, blue's checkpoint it starts
    from, the shadow settings and blue's production sink (read only)."""

    config: SparkpointConfig
    sink: ShadowSink
    blue: BlueJob
    start: SnapshotHandle
    shadow: Shadow
    user_sink: Sink
    #: the cutover this warm-up belongs to (it then ends at the agreed batch, once blue
    #: stopped there), or None: a plain warm-up
    handover: Handover | None = None


def open_blue(cfg: SparkpointConfig) -> Catalog:
    """Blue's catalog, from a shadow's settings (blue's production ``dir`` and ``job``).

    :raises ConfigError: blue's store cannot be opened."""
    try:
        return Catalog.open(cfg.dir, cfg.job, **cfg.storage_options)
    except (StorageError, ValueError) as exc:
        raise ConfigError(f"{PREFIX}dir={cfg.dir!r} (blue's store) cannot be opened: {exc}") from exc


def prepare(cfg: SparkpointConfig, sink: Sink, handover: Handover | None = None) -> Shadowing:
    """Prepare following blue (``cfg``: blue's production settings with
    ``spark.sparkpoint.shadow.*``; `sink`: blue's production sink, only read;
    `handover`: the cutover the warm-up belongs to; None with ``spark.sparkpoint.cutover``
    set: that cutover's records, `runtime.cutover.CutoverHandover`). Reads only.

    :raises ConfigError: a warm-up that cannot be exact: blue's store cannot be opened,
        blue has no such checkpoint, a source of it cannot be read twice, or compare
        mode cannot read blue's batches back from `sink`.
    :raises CutoverError: ``spark.sparkpoint.cutover`` names no cutover of blue's job,
        or one that ended.
    """
    shadow = cfg.shadow
    if shadow is None:
        raise ConfigError(f"{PREFIX}shadow.mode is not set: not a shadow run")
    blue_catalog = open_blue(cfg)
    sink.configure(cfg.storage_options)
    if shadow.mode == "compare":
        follow_compare.check_comparable(sink)
    if handover is None and cfg.cutover is not None:  # green of a cutover: its records decide the end
        handover = CutoverHandover(blue_catalog, sink, cfg.cutover)
        handover.agreed_batch()  # no such cutover, or ended: refused before anything is written
    blue = BlueJob(blue_catalog, sink)
    start = blue.warmup_point(shadow.source)
    _check_followable(start)
    scratch = shadow_config(cfg, start)
    compare_dir = None
    if shadow.mode == "compare":
        compare_dir = f"{work_root(scratch.dir, scratch.job, scratch.work_dir)}/compare"
    return Shadowing(scratch, ShadowSink(shadow.mode, compare_dir), blue, start, shadow, sink, handover)


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


class FollowedRun(Protocol):
    """What the follower uses of the shadow's run (its `runtime.run_state.RunState`): it
    was prepared as a normal run of the shadow job (claim, restore of blue's checkpoint,
    live location, coordinator threads) and is handed to `Follower` instead of a query,
    with the run's staging of a batch (`runtime.job._Run.stage_batch`)."""

    spark: SparkSession
    df: DataFrame
    output_mode: str
    cfg: SparkpointConfig
    catalog: Catalog
    plan: RestorePlan
    stopping: threading.Event
    error: BaseException | None
    query: StreamingQuery | None

    @property
    def fence(self) -> Fence: ...

    @property
    def generation(self) -> int: ...

    @property
    def live(self) -> str: ...

    def stop_query(self) -> None: ...


class Follower:
    """Follows blue for a prepared shadow run (the module docstring, 3 to 6)."""

    def __init__(self, run: FollowedRun, shadowing: Shadowing, *,
                 stage: Callable[[DataFrame, int], None]) -> None:
        self.run = run
        #: the run's foreachBatch: stage batch N in the shadow's sink and record it
        self.stage = stage
        self.blue = shadowing.blue
        self.shadow = shadowing.shadow
        self.start = shadowing.start
        self.user_sink = shadowing.user_sink
        self.shadow_sink = shadowing.sink
        self.handover = shadowing.handover
        self._durations: collections.deque[float] = collections.deque(maxlen=_RATE_WINDOW)
        #: batches replayed from a pending record of blue, by the sha of their offsets
        self._unverified: dict[int, str] = {}
        #: compare mode: replayed batches not compared with blue's commit yet, in order
        self._uncompared: list[int] = []
        self._compared_through: int | None = None
        self._difference: str | None = None
        self.progress: FollowProgress | None = None

    def follow(self) -> None:
        """Replay blue's batches until the end (module docstring, 6); the progress record
        says ``failed`` with the error when it raises.

        :raises SparkpointError: blue diverged, a record is unusable, compare mode found
            a difference, or Spark did not run exactly blue's batch.
        :raises StaleGeneration: the shadow's generation was superseded.
        """
        try:
            self._follow()
        except Exception as exc:
            self._report(state="failed", error=str(exc))
            raise

    # -- following ------------------------------------------------------------------------

    def _follow(self) -> None:
        restart = self.run.plan.batch_id
        offsets = livedir.read_log_file(self.run.live, f"offsets/{restart}") if restart is not None else None
        if restart is None or offsets is None:
            raise SparkpointError(f"the shadow's live location {self.run.live} holds no offsets of its "
                                  "restart point")
        prev = replay.sha(offsets)
        batch = restart + 1
        self._report(state="following")
        while not self.run.stopping.is_set() and self.run.error is None:
            self._verify_committed()
            self._compare_committed()
            until = self._until()
            if until is not None and batch > until:
                break
            found = self.blue.record(batch)
            if found is None:
                running, _last = self.blue.status()
                if not running and self.blue.record(batch) is None:
                    break  # blue ended: everything it recorded is replayed
                self._report(state="caught_up")
                self.run.stopping.wait(self.shadow.poll_interval_s)
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
            faults.maybe_kill("cutover_warmup", batch)
            prev = replay.sha(body["offsets"])
            if not committed:
                self._unverified[batch] = prev
            if self.shadow.mode == "compare":
                self._uncompared.append(batch)
            self._report(state="following")
            batch += 1
        self._settle()
        self._await_blue_stop()
        self._report(state="ended")

    def _until(self) -> int | None:
        """The last batch to replay: ``shadow.untilBatch``, or the cutover's agreed N."""
        until = self.shadow.until_batch
        agreed = self.handover.agreed_batch() if self.handover is not None else None
        if agreed is not None:
            until = agreed if until is None else min(until, agreed)
        return until

    def _await_blue_stop(self) -> None:
        """With a cutover whose batch N the shadow reached: wait until blue completed its
        stop at N (green takes the job over only then).

        :raises SparkpointError: the shadow ended before N (blue ended first), or blue's
            stop failed or ended elsewhere."""
        if self.handover is None or self.run.stopping.is_set():
            return
        agreed = self.handover.agreed_batch()
        if agreed is None:
            raise SparkpointError("blue ended before the cutover agreed a batch; green does not take over")
        last = livedir.last_commit(self.run.live)
        if last != agreed:
            raise SparkpointError(f"the shadow replayed through batch {last}, not the agreed batch {agreed}: "
                                  "blue ended before it; green does not take over")
        while not self.handover.blue_stopped():
            self._report(state="caught_up")
            if self.run.stopping.wait(self.shadow.poll_interval_s):
                return
        faults.maybe_kill("cutover_ready", agreed)

    def _settle(self) -> None:
        """At the end: wait until blue committed every batch the shadow replayed from a
        pending record (and compare them), while blue runs; once it does not, every one
        must be committed (`_verify_committed`)."""
        while self._unverified or self._uncompared:
            self._verify_committed()
            self._compare_committed()
            if not (self._unverified or self._uncompared) or self.run.stopping.is_set():
                return
            running, _last = self.blue.status()
            if not running:
                self._verify_committed(final=True)
                self._compare_committed()
                return
            self.run.stopping.wait(self.shadow.poll_interval_s)

    def _replay(self, body: Mapping[str, Any]) -> None:
        batch = int(body["batch"])
        self.run.fence.check()
        faults.pause("shadow_replay", batch, generation=self.run.generation)
        began = time.monotonic()
        replay.write_batch(self.run.live, body)

        def started(query: StreamingQuery) -> None:
            self.run.query = query
            if self.run.stopping.is_set():  # a stop that came before the query: reach it
                self.run.stop_query()

        replay.run_batch(self.run.spark, self.run.df, self.run.output_mode, self.run.live, batch,
                         stage=self.stage, started=started)
        self._durations.append(time.monotonic() - began)
        log.info("shadow %s replayed blue's batch %d in %.2f s", self.run.cfg.job, batch, self._durations[-1])

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
            path = self.shadow_sink.batch_dir(self.run.cfg.job, batch)
            green = self.run.spark.read.parquet(path) if os.path.isdir(path) else None
            found = follow_compare.difference(
                green, follow_compare.blue_rows(self.run.spark, self.user_sink, self.blue.job, batch), batch)
            if found is not None:
                self._difference = found
                raise SparkpointError(f"the shadow's output differs from what blue committed: {found}")
            self._compared_through = batch
            self._uncompared.pop(0)

    def _report(self, *, state: str, error: str | None = None) -> None:
        """Write the progress record; never fails the run (it is read by others only)."""
        try:
            _running, blue_last = self.blue.status()
            last = livedir.last_commit(self.run.live)
            replayed = last if last is not None else self.start.metadata.batch_id
            verified = min(self._unverified, default=replayed + 1) - 1
            rate = sum(self._durations) / len(self._durations) if self._durations else None
            if self.progress is None:
                self.progress = FollowProgress(
                    shadow_job=self.run.cfg.job, blue_job=self.blue.job, mode=self.shadow.mode, state=state,
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
            write_follow(self.run.catalog.store, self.progress)
            if self.handover is not None:
                self.handover.report(self.progress, self.run.generation)
        except (SparkpointError, OSError) as exc:
            log.warning("shadow %s: could not write its progress record: %s", self.run.cfg.job, exc)
