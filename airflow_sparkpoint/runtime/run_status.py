"""What a run (`run_state.RunState`) reports about itself: the heartbeat, the status
record of its generation and the run's result (`StatusWriter`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from airflow_sparkpoint.checkpoints.run_result import RunResult
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.exceptions import StaleGeneration, StorageError
from airflow_sparkpoint.runtime.run_state import RunState

__all__ = ["StatusWriter"]

log = logging.getLogger(__name__)


class StatusWriter:
    """Writes the status record of `state`'s generation (never over a newer
    generation's, never ``running`` after a final state) and builds its result."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._final_state = False
        #: set when the run ends: the heartbeat thread stops
        self.heartbeat_stop = threading.Event()

    def heartbeat(self) -> None:
        """Write ``running`` with the current time (a live run's proof of life)."""
        self.write("running")

    def heartbeat_loop(self) -> None:
        """The heartbeat thread: `heartbeat` every poll interval until `heartbeat_stop`."""
        while not self.heartbeat_stop.wait(self.state.cfg.poll_interval_s):
            self.heartbeat()

    def write(self, state: str, error: str | None = None) -> None:
        """Write the status record with `state` (and `error`); a storage error is logged,
        a newer generation's record is left alone."""
        run = self.state
        checkpointer = run.built_checkpointer
        last = checkpointer.last_checkpoint if checkpointer is not None else None
        status = JobStatus(
            job=run.cfg.job, generation=run.generation, state=state, started_at=run.started_at,
            heartbeat_at=time.time(),
            last_batch=checkpointer.confirmed_batch if checkpointer is not None else None,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint_uri=run.catalog.checkpoint_uri(last.id) if last else None,
            checkpoints_completed=checkpointer.checkpoints_completed if checkpointer is not None else 0,
            savepoint_uri=run.savepoint_uri, error=error, host=socket.gethostname(), pid=os.getpid(),
            application_id=run.application_id, live_dir=run.live_dir,
        ).to_json()
        with self._lock:
            if self._final_state and state == "running":
                return  # a late heartbeat must not undo finished/stopped/failed
            if state != "running":
                self._final_state = True
            try:
                # One existence check (claims are contiguous), not a listing of every generation.
                run.fence.check()
                run.catalog.write_status(status)
            except StaleGeneration:
                return  # a newer run owns the status record
            except StorageError as exc:
                log.warning("could not write the status of job %s: %s", run.cfg.job, exc)

    def result(self, state: str) -> RunResult:
        """The run's result, ended in `state` (``finished`` or ``stopped``)."""
        run = self.state
        checkpointer = run.checkpointer
        last = checkpointer.last_checkpoint
        return RunResult(
            status=state, job=run.cfg.job, generation=run.generation,
            batches_processed=run.batches_staged, first_batch=run.first_batch,
            last_batch=checkpointer.confirmed_batch,
            last_checkpoint_id=last.id if last else None,
            last_checkpoint=run.catalog.checkpoint_uri(last.id) if last else None,
            savepoint=run.savepoint_uri,
            restored_from=run.plan.snapshot.uri if run.plan.snapshot else None,
            restore_mode=("in-place" if run.choice is not None and run.choice.in_place
                          else ("snapshot" if run.plan.snapshot else "empty")),
            checkpoints_completed=checkpointer.checkpoints_completed,
            **RunResult.committed(run.committer.batches_committed),
            recovered=run.recovered,
            live_dir=run.live,
            live_reuse=run.live_reuse.to_json(),
            rescaled=run.rescaled,
        )
