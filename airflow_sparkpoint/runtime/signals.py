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
from typing import Any

from airflow_sparkpoint.exceptions import SparkpointError

log = logging.getLogger(__name__)

#: seconds between the status record and a forced exit of a driver that did not end
EXIT_GRACE_S = 10.0
REASON = "terminated by SIGTERM"


class Terminated(SparkpointError):
    """The driver received SIGTERM; the run ended without finishing."""


def terminate(run: Any, reason: str = REASON, *, exit_grace_s: float | None = EXIT_GRACE_S) -> bool:
    """End `run` (a ``runtime.job._Run``) because the process is being terminated.

    Marks it so it takes on nothing new, and (in a thread, so this returns at once)
    records its failed status and stops its query; `exit_grace_s` later the process
    exits with 143 unless it ended by itself (None: never force). Returns False when
    the run was already terminating.
    """
    if isinstance(getattr(run, "error", None), Terminated):
        return False
    run.error = Terminated(f"job {run.cfg.job!r} generation {getattr(run, 'generation', '?')}: {reason}")
    run.stopping.set()
    worker = threading.Thread(target=_record_and_stop, args=(run, reason, exit_grace_s),
                              name="sparkpoint-sigterm", daemon=True)
    worker.start()
    return True


def _record_and_stop(run: Any, reason: str, exit_grace_s: float | None) -> None:
    try:
        if hasattr(run, "coordinator"):  # a generation was claimed: its status is ours to end
            run._write_status("failed", error=reason)
            log.warning("job %s generation %d: %s; recorded state failed, taking on nothing new",
                        run.cfg.job, run.generation, reason)
        run._stop_query()
    except Exception as exc:  # noqa: BLE001 - the process is going away: log, never raise
        log.warning("job %s: recording %r failed: %s", run.cfg.job, reason, exc)
    if exit_grace_s is not None and not _exited.wait(exit_grace_s):
        log.error("job %s did not end %.0f s after %s; exiting", run.cfg.job, exit_grace_s, reason)
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)


#: set when the run that installed the handler has ended (the forced exit is off)
_exited = threading.Event()


@contextmanager
def sigterm_ends_run(run: Any, *, exit_grace_s: float | None = EXIT_GRACE_S) -> Iterator[None]:
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
        if getattr(run, "query", None) is not None:
            terminate(run, exit_grace_s=exit_grace_s)
            return
        if not hasattr(run, "generation"):
            raise Terminated(f"job {run.cfg.job!r}: {REASON} before it claimed a generation")
        run.error = Terminated(f"job {run.cfg.job!r} generation {run.generation}: {REASON} before its query started")
        run.stopping.set()
        _record_and_stop(run, REASON, None)  # no query and no heartbeat yet: nothing to race with
        raise run.error

    _exited.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _exited.set()
