"""The start-up of a run (`RunStartup`, on the run's `run_state.RunState`) before its
query starts: open and check the store and the sink, claim a generation (in
`job._Run.execute`), then read everything again, record the lineage origin, settle and
recover transactions, fill the live location and build the checkpointer and the
committer."""

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
from airflow_sparkpoint.runtime.run_state import RunState
from airflow_sparkpoint.runtime.run_status import StatusWriter
from airflow_sparkpoint.storage import open_storage

__all__ = ["RunStartup"]

log = logging.getLogger(__name__)


class RunStartup:
    """Opening and preparing a run; see `prepare` for the order (claim, then act).
    Everything that can fail does so before anything is written."""

    def __init__(self, state: RunState, status: StatusWriter) -> None:
        self.state = state
        self.status = status

    def open(self) -> None:
        """Open and check the store, the sink and the work directory of the run.

        :raises ConfigError: the store cannot be opened; the sink's settings are invalid.
        :raises StorageError: the store is not reachable or has no conditional create.
        """
        run = self.state
        cfg = run.cfg
        try:
            storage = open_storage(cfg.dir, **cfg.storage_options)
        except Exception as exc:
            raise ConfigError(f"{PREFIX}dir={cfg.dir!r} cannot be opened: {exc}") from exc
        try:
            storage.check()
            storage.check_exclusive_create()  # generation claims are conditional creates
        except StorageError as exc:
            raise StorageError(f"{PREFIX}dir={cfg.dir!r} is not reachable: {exc}") from exc
        run.catalog = Catalog(storage, cfg.job)
        run.control = ControlChannel(run.catalog)
        run.sink.configure(cfg.storage_options)
        run.sink.validate()
        run.work_root = work_root(cfg.dir, cfg.job, cfg.work_dir)
        # a cluster: one path, one filesystem
        executor_reach.check_executors_reach(run.spark, run.work_root)

    def check_plan(self, plan: RestorePlan) -> None:
        """The read-only refusals of a restore plan: run before the claim (bad input fences
        no running generation, invariant 7) and again on the plan read after it.

        :raises RestoreError: the snapshot was taken on a newer Spark line.
        :raises SinkAheadError: the sink is ahead of the snapshot and cannot be handled, or
            (`SinkLineageError`) does not hold what the snapshot's lineage committed.
        """
        run = self.state
        if plan.snapshot is not None:
            spark_support.check_restore_line(plan.snapshot.metadata.spark.get("version"), run.spark.version,
                                             plan.snapshot.uri)
        check_sink_position(plan, run.sink, run.cfg.job, apply=False, catalog=run.catalog)

    def prepare(self) -> None:
        """Claim, then act (invariant 8): everything is read again after the claim, the
        origin of this generation's lineage is recorded before any effect, and every
        effect is fenced by the generation."""
        run = self.state
        cfg = run.cfg
        plan = run.plan = plan_restore(cfg, run.catalog)
        self.check_plan(plan)
        run.rescale = rescale.plan_rescale(cfg.restore_state_partitions, plan)
        status = read_job_status(run.catalog)
        origins = run.catalog.origins()
        adopted = run.adopted
        if adopted is not None:  # green at a cutover: its own state at N, in its own location
            if plan.batch_id != adopted.batch_id or not run.catalog.has_origin(run.generation):
                raise SparkpointError(
                    f"job {cfg.job!r} generation {run.generation} adopted at batch {adopted.batch_id}, but "
                    f"its restart point is {plan.description} (origin recorded: "
                    f"{run.catalog.has_origin(run.generation)}); green does not go on")
            choice = adopted_live(adopted.live_dir, job=cfg.job, generation=run.generation,
                                  jvm_pid=_jvm_pid(run.spark))
        else:
            previous = [origins[-1].live_dir if origins else None, status.live_dir if status else None]
            choice = choose_live(
                plan, previous, status,
                work_root=run.work_root, job=cfg.job, generation=run.generation, jvm_pid=_jvm_pid(run.spark),
                allow_in_place=not (run.rescale and run.rescale.needed),  # rescale a private copy only
            )
        run.choice = choice
        run.live = choice.path
        meta: SnapshotMetadata | None = plan.snapshot.metadata if plan.snapshot else None
        inherited = plan.continues.restore if plan.continues is not None else {}
        pin = pin_restart_point(plan, run.catalog, run.generation)  # owned before the origin relies on it
        if adopted is None:  # an adopted generation's origin was written by its claim
            run.catalog.write_origin(new_origin(
                run.generation, kind=plan.kind, uri=plan.snapshot.uri if plan.snapshot else None,
                base_id=plan.base_id,
                snapshot_id=meta.id if meta else None, batch_id=meta.batch_id if meta else None,
                id_floor=run.catalog.next_checkpoint_id() - 1,
                restore={"restore": cfg.restore, "sink_ahead": plan.sink_ahead, "force": cfg.restore_force,
                         "allow_foreign_job": (cfg.restore_allow_foreign_job
                                               or bool(inherited.get("allow_foreign_job"))),
                         "state_partitions": cfg.restore_state_partitions},
                live_dir=run.live, host=socket.gethostname(), pid=os.getpid(), pin=pin,
                base_generation=meta.generation if meta is not None and plan.kind == "checkpoint"
                and plan.base_id >= 0 else None,
            ))
        log.info("job %s generation %d starts from %s; live location %s (%s)",
                 cfg.job, run.generation, plan.description, run.live, choice.reason)

        run_fence = run.fence
        fence = run_fence.check
        fence()
        # Abort what the restart point does not confirm before the sink's position is
        # checked: a stalled committer past its generation check can land nothing after it.
        settled = settle_unconfirmed(run.catalog, run.sink, plan, run.generation)
        try:
            rewound = check_sink_position(plan, run.sink, cfg.job, fence=fence, catalog=run.catalog)
        except SinkAheadError:
            # A newer generation that started meanwhile commits its own lineage: a
            # superseded start is stale, not refused (its origin is history already).
            fence()
            raise
        if rewound:
            faults.pause("after_rewind", plan.batch_id, generation=run.generation)
        faults.pause("before_live", plan.batch_id, generation=run.generation)
        repair = spark_support.snapshot_repair(run.spark.version,
                                               run.spark.conf.get(spark_support.SNAPSHOT_REPAIR_KEY, None))
        index, run.live_reuse = fill_live(choice, plan, repair=repair)
        run.committer = Committer(catalog=run.catalog, sink=run.sink, fence=run_fence,
                                   commit_mode=cfg.commit_mode)
        run.checkpointer = Checkpointer(
            catalog=run.catalog, fence=run_fence, live_root=run.live, transactions=run.committer,
            interval_s=cfg.checkpoint_interval_s, num_retained=cfg.num_retained,
            timeout_s=cfg.checkpoint_timeout_s,
            tolerable_failures=cfg.tolerable_failures, spark_info=_spark_info(run),
            on_status=self.status.heartbeat,
        )
        run.committer.seed(meta)
        run.checkpointer.seed(meta, index)
        if plan.snapshot is not None and not plan.own_files:
            run.checkpointer.store_ahead(plan.snapshot.files_store)  # overlaps Spark's first batch
        pending, recovered = recover_transactions(run.catalog, run.sink, plan, cfg.commit_mode,
                                                  run.generation, settled=settled)
        for record in pending:
            run.committer.add_pending(record)
        if plan.replays_ahead(run.sink):  # the self-healing fallback (runtime.replay)
            self.status.write("running")  # a long replay must not look like a dead run
            recovered["replayed"] = replay.replay_committed(
                run.spark, run.df, run.output_mode, sink=run.sink, fence=run_fence,
                snapshot=plan.snapshot, live_root=run.live, job=cfg.job, code_version=plan.code_version)
            if recovered["replayed"]:  # the snapshot's position of this sink is behind what it holds now
                run.committer.sink_positions.pop(run.sink.sink_id, None)
                owners = _committers(run, recovered["replayed"])
                run.checkpointer.replayed(recovered["replayed"][-1])
                run.committer.add_owners(owners)
        run.recovered = recovered
        # After any replay: the state of the live location's last batch is rescaled.
        rescaled = rescale.rescale_live(run.spark, run.live, run.rescale, fence) if run.rescale and \
            run.rescale.needed else None
        run.rescaled = rescale.summary(run.rescale, rescaled)
        rescale.apply_shuffle_partitions(run.spark, run.rescale)
        if rescaled is not None:
            # The rescaled state is the restart point from now on (no input, no transaction).
            run.checkpointer.confirm(rescaled)
            run.checkpointer.checkpoint(rescaled)
        if adopted is not None:
            # The adoption checkpoint: green's state at N in the job's catalog, so that from
            # here on restore=latest resumes green's state (every file stored: none is blue's).
            run.checkpointer.confirm(adopted.batch_id)
            run.committer.handover_batch = adopted.batch_id  # its first commit: a cutover fault point
            if run.checkpointer.checkpoint(adopted.batch_id) is None:
                raise SparkpointError(f"the adoption checkpoint of job {cfg.job!r} at batch "
                                      f"{adopted.batch_id} failed; green does not go on (restore=latest "
                                      "resumes blue's state at N)")
        self.status.write("running")


def _committers(run: RunState, batches: list[int]) -> list[tuple[int, int]]:
    """``(batch, generation)`` of the commits `run`'s sink holds for replayed `batches`:
    the lineage's owners of them (`Committer.batch_owners`)."""
    found = []
    for batch in batches:
        try:
            held = run.sink.committed_txn(run.cfg.job, batch)
        except NotImplementedError:
            return []
        if held is not None and held.generation is not None:
            found.append((batch, held.generation))
    return found


def _jvm_pid(spark: Any) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - only used to prove a previous owner gone
        return None


def _spark_info(run: RunState) -> dict[str, Any]:
    conf = run.spark.conf
    return {
        "version": run.spark.version,
        "state_store": conf.get("spark.sql.streaming.stateStore.providerClass", ""),
        "output_mode": run.output_mode,
        "trigger": str(run.cfg.trigger),
    }
