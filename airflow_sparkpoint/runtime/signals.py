"""SIGTERM in the Spark driver: record the end of this run at once, act no more.

Airflow's task supervisor ends a task that is marked failed, cleared or timed out with
SIGTERM to the task's whole process group (the operator, a client-mode ``spark-submit``
JVM and its Python driver) and SIGKILL 5 seconds later; Kubernetes and YARN do the same
with their own grace periods. Nothing graceful (a stop-with-savepoint) fits in that, so
on SIGTERM a run only makes sure that the next run can prove it gone:

1. it stops taking on new effects: no new batch is staged or recorded, no new
   checkpoint, commit or control request is started (the run's ``error`` is set, which
   the coordinator and ``foreachBatch`` check; its ``stopping`` event is set);
2. within a second or two it records the terminal status of its own generation:
   state ``failed``, error ``terminated by SIGTERM`` (never over a newer generation's);
3. it asks the streaming query to stop and lets the run end as a failure; if the
   process has not exited `EXIT_GRACE_S` seconds later it exits with status 143.

Staged output of a batch in flight is neither promoted nor lost: the next run's
restore-time recovery commits what a completed checkpoint confirmed and aborts the rest,
as after any crash. A checkpoint or commit already running when the signal arrives
finishes or is cut short by the SIGKILL; both are safe for the same reason.

Installed by `SparkpointJob.run` for the duration of a run, in the main thread only
(Python delivers signals there); the previous handler is put back afterwards.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from airflow_sparkpoint.exceptions import Terminated

__all__ = ["EXIT_GRACE_S", "REASON", "Terminable", "Terminated", "sigterm_ends_run", "terminate"]

log = logging.getLogger(__name__)

#: seconds between the status record and a forced exit of a driver that did not end
EXIT_GRACE_S = 10.0
REASON = "terminated by SIGTERM"


class Terminable(Protocol):
    """What SIGTERM needs of a run (`runtime.job._Run` is one)."""

    #: the run's failure; set here, read by its coordinator and ``foreachBatch``
    error: BaseException | None

    @property
    def stopping(self) -> threading.Event:
        """Set here: the run takes on nothing new."""
        ...

    @property
    def job_name(self) -> str:
        """The job's name, for the messages."""
        ...

    @property
    def claimed_generation(self) -> int | None:
        """The generation the run claimed; None before its claim."""
        ...

    @property
    def query_started(self) -> bool:
        """Whether the run's streaming query was started."""
        ...

    def record_terminated(self, reason: str) -> bool:
        """Record the failed status (error `reason`) of the run's generation once its
        start-up has built what the status reports (before, the start-up's own failure
        path records it); return whether it did."""
        ...

    def stop_query(self) -> None:
        """Ask the streaming query, if any, to stop; never raise for a query already gone."""
        ...


def terminate(run: Terminable, reason: str = REASON, *, exit_grace_s: float | None = EXIT_GRACE_S) -> bool:
    """End `run` because the process is being terminated.

    Marks it so it takes on nothing new, and (in a thread, so this returns at once)
    records its failed status and stops its query; `exit_grace_s` later the process
    exits with 143 unless it ended by itself (None: never force). Returns False when
    the run was already terminating.
    """
    if isinstance(run.error, Terminated):
        return False
    generation = run.claimed_generation
    run.error = Terminated(f"job {run.job_name!r} generation {'?' if generation is None else generation}: "
                           f"{reason}")
    run.stopping.set()
    worker = threading.Thread(target=_record_and_stop, args=(run, reason, exit_grace_s),
                              name="sparkpoint-sigterm", daemon=True)
    worker.start()
    return True


def _record_and_stop(run: Terminable, reason: str, exit_grace_s: float | None) -> None:
    try:
        if run.record_terminated(reason):  # a generation was claimed: its status is ours to end
            log.warning("job %s generation %s: %s; recorded state failed, taking on nothing new",
                        run.job_name, run.claimed_generation, reason)
        run.stop_query()
    except Exception as exc:  # noqa: BLE001 - the process is going away: log, never raise
        log.warning("job %s: recording %r failed: %s", run.job_name, reason, exc)
    if exit_grace_s is not None and not _exited.wait(exit_grace_s):
        log.error("job %s did not end %.0f s after %s; exiting", run.job_name, exit_grace_s, reason)
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)


#: set when the run that installed the handler has ended (the forced exit is off)
_exited = threading.Event()


@contextmanager
def sigterm_ends_run(run: Terminable, *, exit_grace_s: float | None = EXIT_GRACE_S) -> Iterator[None]:
    """While the block runs, SIGTERM ends `run` (see the module docstring).

    Before its streaming query started (restore, recovery) the run is cut short where
    it is, as by a crash: SIGTERM records the failed status of its generation (if it
    claimed one) and raises `Terminated` in the main thread. Outside the main thread
    (a run started from a thread, e.g. in tests) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if run.query_started:
            terminate(run, exit_grace_s=exit_grace_s)
            return
        generation = run.claimed_generation
        if generation is None:
            raise Terminated(f"job {run.job_name!r}: {REASON} before it claimed a generation")
        error = Terminated(f"job {run.job_name!r} generation {generation}: {REASON} before its query started")
        run.error = error
        run.stopping.set()
        _record_and_stop(run, REASON, None)  # no query and no heartbeat yet: nothing to race with
        raise error

    _exited.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _exited.set()
