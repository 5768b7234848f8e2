"""The start-up of a run (`job._Run`) before its query starts: open and check the store
and the sink, claim a generation (in `job._Run.execute`), then read everything again,
record the lineage origin, settle and recover transactions, fill the live location and
build the coordinator."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.exceptions import ConfigError, SinkAheadError, SparkpointError, StorageError
from airflow_sparkpoint.runtime import executor_reach, replay, rescale, spark_support
from airflow_sparkpoint.runtime.checkpointer import Checkpointer
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.config import PREFIX, work_root
from airflow_sparkpoint.runtime.follow import Adopted
from airflow_sparkpoint.runtime.recovery import recover_transactions, settle_unconfirmed
from airflow_sparkpoint.runtime.restore import (
    adopted_live,
    check_sink_position,
    choose_live,
    fill_live,
    pin_restart_point,
    plan_restore,
)
from airflow_sparkpoint.runtime.restore_plan import RestorePlan
from airflow_sparkpoint.runtime.run_status import _RunStatus
from airflow_sparkpoint.storage import open_storage

__all__: list[str] = []

log = logging.getLogger(__name__)


class _RunStartup(_RunStatus):
    """Opening and preparing a run; see `_prepare` for the order (claim, then act)."""

    #: green's run after it took the job over at a cutover (`follow.Adopted`), or None
    adopted: Adopted | None = None

    # -- preparation: everything that can fail does so before anything is written -----

    def _open(self) -> None:
        cfg = self.cfg
        try:
            storage = open_storage(cfg.dir, **cfg.storage_options)
        except Exception as exc:
            raise ConfigError(f"{PREFIX}dir={cfg.dir!r} cannot be opened: {exc}") from exc
        try:
            storage.check()
            storage.check_exclusive_create()  # generation claims are conditional creates
        except StorageError as exc:
            raise StorageError(f"{PREFIX}dir={cfg.dir!r} is not reachable: {exc}") from exc
        self.catalog = Catalog(storage, cfg.job)
        self.control = ControlChannel(self.catalog)
        self.sink.configure(cfg.storage_options)
        self.sink.validate()
        self.work_root = work_root(cfg.dir, cfg.job, cfg.work_dir)
        # a cluster: one path, one filesystem
        executor_reach.check_executors_reach(self.spark, self.work_root)

    def _check_plan(self, plan: RestorePlan) -> None:
        """The read-only refusals of a restore plan: run before the claim (bad input fences
        no running generation, invariant 7) and again on the plan read after it.

        :raises RestoreError: the snapshot was taken on a newer Spark line.
        :raises SinkAheadError: the sink is ahead of the snapshot and cannot be handled, or
            (`SinkLineageError`) does not hold what the snapshot's lineage committed.
        """
        if plan.snapshot is not None:
            spark_support.check_restore_line(plan.snapshot.metadata.spark.get("version"), self.spark.version,
                                             plan.snapshot.uri)
        check_sink_position(plan, self.sink, self.cfg.job, apply=False, catalog=self.catalog)

    def _prepare(self) -> None:
        """Claim, then act (invariant 8): everything is read again after the claim, the
        origin of this generation's lineage is recorded before any effect, and every
        effect is fenced by the generation."""
        cfg = self.cfg
        plan = self.plan = plan_restore(cfg, self.catalog)
        self._check_plan(plan)
        self.rescale = rescale.plan_rescale(cfg.restore_state_partitions, plan)
        status = read_job_status(self.catalog)
        origins = self.catalog.origins()
        adopted = self.adopted
        if adopted is not None:  # green at a cutover: its own state at N, in its own location
            if plan.batch_id != adopted.batch_id or not self.catalog.has_origin(self.generation):
                raise SparkpointError(
                    f"job {cfg.job!r} generation {self.generation} adopted at batch {adopted.batch_id}, but "
                    f"its restart point is {plan.description} (origin recorded: "
                    f"{self.catalog.has_origin(self.generation)}); green does not go on")
            self.choice = adopted_live(adopted.live_dir, job=cfg.job, generation=self.generation,
                                       jvm_pid=self._jvm_pid())
        else:
            previous = [origins[-1].live_dir if origins else None, status.live_dir if status else None]
            self.choice = choose_live(
                plan, previous, status,
                work_root=self.work_root, job=cfg.job, generation=self.generation, jvm_pid=self._jvm_pid(),
                allow_in_place=not (self.rescale and self.rescale.needed),  # rescale a private copy only
            )
        self.live = self.choice.path
        meta: SnapshotMetadata | None = plan.snapshot.metadata if plan.snapshot else None
        inherited = plan.continues.restore if plan.continues is not None else {}
        pin = pin_restart_point(plan, self.catalog, self.generation)  # owned before the origin relies on it
        if adopted is None:  # an adopted generation's origin was written by its claim
            self.catalog.write_origin(new_origin(
                self.generation, kind=plan.kind, uri=plan.snapshot.uri if plan.snapshot else None,
                base_id=plan.base_id,
                snapshot_id=meta.id if meta else None, batch_id=meta.batch_id if meta else None,
                id_floor=self.catalog.next_checkpoint_id() - 1,
                restore={"restore": cfg.restore, "sink_ahead": plan.sink_ahead, "force": cfg.restore_force,
                         "allow_foreign_job": (cfg.restore_allow_foreign_job
                                               or bool(inherited.get("allow_foreign_job"))),
                         "state_partitions": cfg.restore_state_partitions},
                live_dir=self.live, host=socket.gethostname(), pid=os.getpid(), pin=pin,
            ))
        log.info("job %s generation %d starts from %s; live location %s (%s)",
                 cfg.job, self.generation, plan.description, self.live, self.choice.reason)

        run_fence = self.fence
        fence = run_fence.check
        fence()
        # Abort what the restart point does not confirm before the sink's position is
        # checked: a stalled committer past its generation check can land nothing after it.
        settled = settle_unconfirmed(self.catalog, self.sink, plan, self.generation)
        try:
            rewound = check_sink_position(plan, self.sink, cfg.job, fence=fence, catalog=self.catalog)
        except SinkAheadError:
            # A newer generation that started meanwhile commits its own lineage: a
            # superseded start is stale, not refused (its origin is history already).
            fence()
            raise
        if rewound:
            faults.pause("after_rewind", plan.batch_id, generation=self.generation)
        faults.pause("before_live", plan.batch_id, generation=self.generation)
        repair = spark_support.snapshot_repair(self.spark.version,
                                               self.spark.conf.get(spark_support.SNAPSHOT_REPAIR_KEY, None))
        index, self.live_reuse = fill_live(self.choice, plan, repair=repair)
        self.committer = Committer(catalog=self.catalog, sink=self.sink, fence=run_fence,
                                   commit_mode=cfg.commit_mode)
        self.checkpointer = Checkpointer(
            catalog=self.catalog, fence=run_fence, live_root=self.live, transactions=self.committer,
            interval_s=cfg.checkpoint_interval_s, num_retained=cfg.num_retained,
            timeout_s=cfg.checkpoint_timeout_s,
            tolerable_failures=cfg.tolerable_failures, spark_info=self._spark_info(),
            on_status=self._heartbeat,
        )
        self.committer.seed(meta)
        self.checkpointer.seed(meta, index)
        if plan.snapshot is not None and not plan.own_files:
            self.checkpointer.store_ahead(plan.snapshot.files_store)  # overlaps Spark's first batch
        pending, recovered = recover_transactions(self.catalog, self.sink, plan, cfg.commit_mode,
                                                  self.generation, settled=settled)
        for record in pending:
            self.committer.add_pending(record)
        if plan.replays_ahead(self.sink):  # the self-healing fallback (runtime.replay)
            self._write_status("running")  # a long replay must not look like a dead run
            recovered["replayed"] = replay.replay_committed(
                self.spark, self.df, self.output_mode, sink=self.sink, fence=run_fence,
                snapshot=plan.snapshot, live_root=self.live, job=cfg.job, code_version=plan.code_version)
            if recovered["replayed"]:  # the snapshot's position of this sink is behind what it holds now
                self.committer.sink_positions.pop(self.sink.sink_id, None)
                owners = self._committers(recovered["replayed"])
                self.checkpointer.replayed(recovered["replayed"][-1])
                self.committer.add_owners(owners)
        self.recovered = recovered
        # After any replay: the state of the live location's last batch is rescaled.
        rescaled = rescale.rescale_live(self.spark, self.live, self.rescale, fence) if self.rescale and \
            self.rescale.needed else None
        self.rescaled = rescale.summary(self.rescale, rescaled)
        rescale.apply_shuffle_partitions(self.spark, self.rescale)
        if rescaled is not None:
            # The rescaled state is the restart point from now on (no input, no transaction).
            self.checkpointer.confirm(rescaled)
            self.checkpointer.checkpoint(rescaled)
        if adopted is not None:
            # The adoption checkpoint: green's state at N in the job's catalog, so that from
            # here on restore=latest resumes green's state (every file stored: none is blue's).
            self.checkpointer.confirm(adopted.batch_id)
            if self.checkpointer.checkpoint(adopted.batch_id) is None:
                raise SparkpointError(f"the adoption checkpoint of job {cfg.job!r} at batch "
                                      f"{adopted.batch_id} failed; green does not go on (restore=latest "
                                      "resumes blue's state at N)")
        self._write_status("running")

    def _committers(self, batches: list[int]) -> list[tuple[int, int]]:
        """``(batch, generation)`` of the commits the sink holds for replayed `batches`: the
        lineage's owners of them (`Coordinator.batch_owners`)."""
        found = []
        for batch in batches:
            try:
                held = self.sink.committed_txn(self.cfg.job, batch)
            except NotImplementedError:
                return []
            if held is not None and held.generation is not None:
                found.append((batch, held.generation))
        return found

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
