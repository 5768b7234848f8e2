"""The coordinator thread of a run (`RunCoordinator`, on the run's `run_state.RunState`):
it alone confirms batches, takes
checkpoints and savepoints, commits, serves control requests, and finishes the run after
the query ended (final checkpoint, final RocksDB snapshot, stop-with-savepoint, the stop
after an agreed batch of a zero-downtime cutover: ``stop_after``)."""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.control import ControlRequest
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.exceptions import (
    ConfigError,
    ControlError,
    ObjectExists,
    SinkLineageError,
    SparkpointError,
    StaleGeneration,
    StorageError,
)
from airflow_sparkpoint.runtime import heap, livedir
from airflow_sparkpoint.runtime.config import parse_duration
from airflow_sparkpoint.runtime.run_state import RunState

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["CONTROL_CLEANUP_BACKLOG_S", "CONTROL_CLEANUP_BATCH", "CONTROL_CLEANUP_EVERY_S", "RunCoordinator",
           "state_store_settings"]

log = logging.getLogger(__name__)

#: How often a run deletes the control requests that finished over a day ago (the
#: requester's side, e.g. the savepoint operator, never does): the run lists `control/`
#: at every poll, so what is never deleted would grow that listing with the job's age.
CONTROL_CLEANUP_EVERY_S = 3600.0
#: Requests deleted per pass, and the pause before the next pass while a backlog (of an
#: earlier release) lasts: a pass runs between checkpoints on the coordinator thread, so
#: a backlog drains in bounded steps (100 every 30 s) instead of holding up checkpoints.
CONTROL_CLEANUP_BATCH = 100
CONTROL_CLEANUP_BACKLOG_S = 30.0


class RunCoordinator:
    """The coordinator thread's loop (`run`) and what it does, on the run's `state`."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        #: whether the control requests left for older generations were withdrawn (`serve_control`)
        self._control_swept = False
        # the housekeeping: when it next runs (monotonic)
        self._control_tidy_at = 0.0
        self._heap_trim_at = 0.0
        #: Spark's state store maintenance interval (s) and minDeltasForSnapshot, read by the
        #: run when its query starts (`state_store_settings`: the JVM may be gone at the end)
        self.snapshot_settings: tuple[float, int] = (60.0, 10)

    def run(self) -> None:
        """The thread: handle the run's events until ``final``; a failure ends the run."""
        run = self.state
        next_poll = 0.0
        try:
            while True:
                timeout = max(0.0, next_poll - time.monotonic())
                try:
                    kind, value = run.events.get(timeout=timeout)
                except queue.Empty:
                    kind, value = "tick", None
                next_poll = self.handle(kind, value, next_poll)
                if kind == "final":
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.failed(exc)
            # Keep draining so the caller's final event finds us gone.

    def handle(self, kind: str, value: object, next_poll: float) -> float:
        """One event of the coordinator thread: ``progress`` (Spark committed batch
        `value`), ``tick`` (no event for a poll interval) or ``final`` (the query ended);
        serve the control channel when `next_poll` (monotonic) has come. Returns the next
        poll time."""
        run = self.state
        if kind == "progress":
            self.confirm(int(value))  # type: ignore[call-overload]
            if run.events.empty():  # else the next event's turn takes this batch too
                self.checkpoint_due()
        elif kind == "tick" and run.cfg.checkpoint_interval_s > 0:
            # An idle stream: its newest batch is checkpointed (and committed) once the
            # interval has passed, not when more input arrives.
            self.checkpoint_due()
        elif kind == "final":
            self.finish()
            return next_poll
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + run.cfg.poll_interval_s
            if not run.stopping.is_set():
                self.serve_control()
            if not run.stopping.is_set() and run.error is None:
                self.tidy_control()
                self.trim_heap()
        return next_poll

    def failed(self, exc: BaseException) -> None:
        """The coordinator thread failed: the run ends with `exc`."""
        run = self.state
        run.error = exc
        log.error("job %s generation %d: %s", run.cfg.job, run.generation, exc)
        run.stopping.set()
        run.stop_query()

    def confirm(self, batch_id: int) -> None:
        """Batch `batch_id` is durable in Spark's commits/ (seen by the commit watcher, or read
        from commits/ after the query ended)."""
        run = self.state
        confirmed = run.checkpointer.confirmed_batch
        if confirmed is None or batch_id > confirmed:
            faults.maybe_kill("confirmed", batch_id)
        run.checkpointer.confirm(batch_id)
        if run.stop_after is not None and batch_id >= run.stop_after and not run.stopping.is_set():
            # N is confirmed: stop now (with no new input Spark would never start N+1 to be refused).
            run.stopping.set()
            run.stop_query()

    def checkpoint_due(self) -> None:
        """Checkpoint (and commit) the due batches, oldest first; between two checkpoints
        serve the control requests, so a savepoint or stop waits for one checkpoint, not for
        the backlog. Stopping ends the round (`finish` takes what is left); a savepoint
        taken meanwhile covers the newest batch, and no older one is checkpointed after it."""
        run = self.state
        for i, batch in enumerate(run.checkpointer.due_batches()):
            if i:
                if not run.stopping.is_set():
                    self.serve_control()
                last = run.checkpointer.last_attempted
                if run.stopping.is_set() or run.error is not None or (last is not None and batch <= last):
                    return
            self.checkpoint_and_commit(batch)

    def checkpoint_and_commit(self, batch_id: int | None) -> None:
        run = self.state
        if batch_id is None or run.error is not None:  # failing or terminating: nothing new
            return
        meta = run.checkpointer.checkpoint(batch_id)
        if meta is not None:
            run.committer.commit_confirmed(run.checkpointer.last_checkpoint)

    def finish(self) -> None:
        """After the query ended: checkpoint its last batch (and, with interval 0, the ones
        before it that have none yet, within `Checkpointer.due_batches`' bound), then commit.

        :raises SparkpointError: the checkpoint of the last batch failed.
        """
        run = self.state
        if run.error is not None:
            self.fail_stop_after(f"the run failed: {run.error}")
            return
        last = livedir.last_commit(run.live)
        if last is not None:
            self.confirm(last)  # the watcher may not have seen it (and earlier ones) yet
            due = run.checkpointer.due_batches(final=True)
            for batch in due:
                if run.checkpointer.checkpoint(batch) is None and batch == due[-1]:
                    raise SparkpointError(f"final checkpoint of batch {batch} failed")
        run.committer.commit_confirmed(run.checkpointer.last_checkpoint)
        self.checkpoint_final_snapshot()
        if run.error is not None:  # e.g. SIGTERM during the wait: take on nothing new
            self.fail_stop_after(f"the run failed: {run.error}")
            return
        if run.stopping.is_set():
            last_checkpoint = run.checkpointer.last_checkpoint
            run.committer.abort_unconfirmed(last_checkpoint.batch_id if last_checkpoint else None)
            if run.stop_request is not None:
                self.complete_stop()
        else:  # the query ended by itself (drained, failed) before batch N
            self.fail_stop_after("the query ended before it reached the batch")

    def checkpoint_final_snapshot(self) -> None:
        """Drained, or stopping with a savepoint, after this run processed batches: let the
        last checkpoint carry the RocksDB snapshot Spark uploads after its last commits
        (`Checkpointer.checkpoint_final_snapshot`). Not after a failure, a cancel or SIGTERM;
        a control request arriving meanwhile ends the wait (nobody serves it during it)."""
        run = self.state
        request = run.stop_request
        if (run.cfg.state_store != "rocksdb" or run.query_failed or run.error is not None
                or not run.batches_staged
                or (run.stopping.is_set()
                    and (request is None or request.kind in ("cancel", "stop_after")))):
            # stop_after: green, not this run, continues from its final checkpoint; the wait
            # would only lengthen the cutover's output gap
            return
        interval, min_deltas = self.snapshot_settings
        timeout = (interval + 30.0 if run.cfg.final_snapshot_timeout_s is None
                   else run.cfg.final_snapshot_timeout_s)
        if request is not None:  # leave the savepoint half of the time the requester gives the stop
            timeout = min(timeout, (request.deadline - time.time()) / 2)
        next_look = [time.monotonic() + run.cfg.poll_interval_s]

        def cancelled() -> bool:
            if run.error is not None:
                return True
            if time.monotonic() < next_look[0]:
                return False
            next_look[0] = time.monotonic() + run.cfg.poll_interval_s
            try:
                return bool(run.control.pending(run.generation))
            except StorageError:
                return False

        run.checkpointer.checkpoint_final_snapshot(min_deltas=min_deltas, timeout_s=timeout,
                                                    min_replay=run.cfg.final_snapshot_min_replay,
                                                    cancelled=cancelled)

    def serve_control(self) -> None:
        """Serve the control requests addressed to this run's generation; on the first
        call, withdraw those left for older generations (their runs are gone)."""
        run = self.state
        if run.error is not None:
            return  # terminating (e.g. SIGTERM): take on nothing new
        if not self._control_swept:
            withdrawn = run.control.withdraw_superseded(run.generation)
            if withdrawn:
                log.warning("job %s generation %d withdrew %d control request(s) "
                            "addressed to earlier runs: %s",
                            run.cfg.job, run.generation, len(withdrawn), withdrawn)
            self._control_swept = True
        for request in run.control.pending(run.generation):
            try:
                run.control.acknowledge(request, run.generation)
            except ObjectExists:
                log.debug("control request %s was taken by another run", request.id)
                continue
            log.info("control request %s: %s", request.id, request.kind)
            if request.kind == "savepoint":
                try:
                    handle = run.checkpointer.savepoint()
                    run.committer.commit_confirmed(run.checkpointer.last_checkpoint)
                except (StaleGeneration, SinkLineageError):
                    raise  # the run ends: no savepoint or later checkpoint may go on without the batch
                except SparkpointError as exc:
                    run.control.fail(request, generation=run.generation, error=str(exc))
                    continue
                run.control.complete(request, generation=run.generation, savepoint=handle.uri,
                                      batch_id=handle.metadata.batch_id)
                run.savepoint_uri = handle.uri
            elif request.kind in ("stop", "cancel"):
                self.fail_stop_after(f"a {request.kind} request ({request.id}) came before the batch")
                run.stop_request = request
                run.stopping.set()
                run.stop_query()
                return
            elif request.kind == "stop_after" and self.accept_stop_after(request):
                return

    def accept_stop_after(self, request: ControlRequest) -> bool:
        """Take acknowledged `request` (stop after batch N) if no batch past N started yet:
        from then on the stage path refuses every batch past N (`job._Run.stage_batch`,
        under the same lock), and the run stops once N is confirmed (`confirm`). Else fail
        it (already past N; another stop_after in force; external commit mode). Returns
        whether it was taken."""
        run = self.state
        n = request.after_batch
        assert n is not None  # `control_records.check_kind`
        reason = None
        if run.stop_request is not None:
            reason = f"a stop after batch {run.stop_after} ({run.stop_request.id}) is already in force"
        elif run.cfg.commit_mode != "checkpoint":
            reason = (f"commit.mode={run.cfg.commit_mode}: the run does not commit batch {n} itself "
                      "(stop_after needs commit.mode=checkpoint)")
        elif request.cutover is not None:
            reason = self.cutover_ended(request.cutover)
        with run.stage_lock:
            started = [b for b in (run.highest_started, run.checkpointer.confirmed_batch) if b is not None]
            if reason is None and started and max(started) > n:
                reason = f"already past batch {n}: batch {max(started)} has started"
            if reason is None:
                run.stop_after = n
        if reason is not None:
            log.warning("job %s generation %d refused stop_after request %s: %s", run.cfg.job,
                        run.generation, request.id, reason)
            run.control.fail(request, generation=run.generation,
                              error=f"generation {run.generation} cannot stop after batch {n}: {reason}")
            return False
        run.stop_request = request
        log.info("job %s generation %d stops after batch %d (request %s)", run.cfg.job, run.generation, n,
                 request.id)
        faults.maybe_kill("stop_after", n)
        confirmed = run.checkpointer.confirmed_batch
        if confirmed is not None and confirmed >= n:
            run.stopping.set()
            run.stop_query()
        return True

    def cutover_ended(self, cutover_id: str) -> str | None:
        """Why a ``stop_after`` of cutover `cutover_id` is refused: the cutover ended
        (called off after the request was filed: a stray request nobody withdrew in time)
        or its records cannot be read (fail closed); None while it is open."""
        try:
            state = CutoverStore(self.state.catalog).read(cutover_id)
        except SparkpointError as exc:
            return f"its cutover {cutover_id} cannot be read ({exc})"
        ended = state.ended  # an abort decision ends it, before the call-off's done record
        if ended is not None:
            return f"its cutover {cutover_id} ended ({ended.outcome} at {ended.step})"
        return None

    def fail_stop_after(self, why: str) -> None:
        """Fail the stop_after request in force, if any (the run ends elsewhere than after
        its batch, or another stop comes first); never raises: the run's own end goes on."""
        run = self.state
        request = run.stop_request
        if request is None or request.kind != "stop_after":
            return
        run.stop_request = None
        with run.stage_lock:
            run.stop_after = None
        confirmed = run.checkpointer.confirmed_batch if run.built_checkpointer is not None else None
        try:
            run.control.fail(request, generation=run.generation,
                              error=f"generation {run.generation} did not stop after batch "
                                    f"{request.after_batch} (last confirmed batch {confirmed}): {why}")
        except (ControlError, StorageError) as exc:
            log.warning("job %s: could not fail stop_after request %s: %s", run.cfg.job, request.id, exc)

    def tidy_control(self) -> None:
        """Delete the control requests that finished over a day ago, at most
        `CONTROL_CLEANUP_BATCH` a pass, a pass an hour (every `CONTROL_CLEANUP_BACKLOG_S`
        while a backlog lasts). Housekeeping never fails the run: an error (the store, an
        unreadable record) is logged and the pass tried again an hour later."""
        run = self.state
        now = time.monotonic()
        if now < self._control_tidy_at:
            return
        try:
            removed = run.control.cleanup(limit=CONTROL_CLEANUP_BATCH)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("job %s: could not remove finished control requests (tried again in %.0f s): %s",
                        run.cfg.job, CONTROL_CLEANUP_EVERY_S, exc)
            removed = 0
        backlog = removed >= CONTROL_CLEANUP_BATCH
        self._control_tidy_at = now + (CONTROL_CLEANUP_BACKLOG_S if backlog else CONTROL_CLEANUP_EVERY_S)

    def trim_heap(self) -> None:
        """Give the driver's free heap memory back to the system, once an hour (`heap`)."""
        now = time.monotonic()
        if now < self._heap_trim_at:
            return
        self._heap_trim_at = now + heap.TRIM_EVERY_S
        heap.trim()

    def complete_stop(self) -> None:
        run = self.state
        request = run.stop_request
        assert request is not None
        if request.kind == "stop_after":
            self.complete_stop_after(request)
            return
        if request.kind == "cancel":
            run.control.complete(request, generation=run.generation,
                                  batch_id=run.checkpointer.confirmed_batch)
            return
        try:
            handle = run.checkpointer.savepoint()
        except SparkpointError as exc:
            run.control.fail(request, generation=run.generation, error=str(exc))
            raise
        run.savepoint_uri = handle.uri
        run.control.complete(request, generation=run.generation, savepoint=handle.uri,
                              batch_id=handle.metadata.batch_id)
        faults.maybe_kill("stopped", handle.metadata.batch_id)

    def complete_stop_after(self, request: ControlRequest) -> None:
        """The run stopped after the agreed batch N: its final checkpoint is at N and the
        sink holds its batches through N (read from the sink, invariant 3); take the final
        savepoint of N (a copy of that checkpoint under ``savepoints/``, which no checkpoint
        retention removes: what a rollback after the cutover restores, once green's
        retention retired the checkpoint), then complete the request with N, the
        checkpoint's and the savepoint's URIs. Anything else fails it."""
        run = self.state
        n = request.after_batch
        last = run.checkpointer.last_checkpoint
        position = run.sink.committed_position(run.cfg.job)
        if last is None or last.batch_id != n or position != n:
            self.fail_stop_after("its final checkpoint is of batch "
                                  f"{last.batch_id if last else None} and the sink holds batches "
                                  f"through {position}")
            return
        try:
            handle = run.checkpointer.savepoint()  # of `last` (N is its newest confirmed batch)
        except SparkpointError as exc:
            self.fail_stop_after(f"its final savepoint of batch {n} failed: {exc}")
            return
        run.savepoint_uri = handle.uri
        faults.maybe_kill("stopped_after", n)
        run.control.complete(request, generation=run.generation, batch_id=n,
                              checkpoint=run.catalog.checkpoint_uri(last.id), savepoint=handle.uri)
        log.info("job %s generation %d stopped after batch %d: final checkpoint chk-%d, final savepoint %s",
                 run.cfg.job, run.generation, n, last.id, handle.uri)


def state_store_settings(spark: SparkSession) -> tuple[float, int]:
    """Spark's ``stateStore.maintenanceInterval`` (seconds) and ``minDeltasForSnapshot``."""
    conf = spark.conf
    interval = str(conf.get("spark.sql.streaming.stateStore.maintenanceInterval", "60s") or "60s").strip()
    try:  # Spark reads a bare number as milliseconds
        seconds = int(interval) / 1000 if interval.isdigit() else parse_duration("", interval)
        return seconds, int(conf.get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10") or "10")
    except (ConfigError, ValueError):
        return 60.0, 10
