"""Starting a job that is already running: the one rule, used by the submit operator
(before spark-submit) and by the driver (before it claims a generation).

Every start takes a new generation and so fences the running one (invariant 5). That is
what a retry or a clear of the same task wants (its earlier try is dead or a zombie),
and what a manual trigger, a backfill or a second DAG with the same job name must not
do silently. So a start is refused when the job's live generation was started by
another task instance (or by none: a manual or CLI start), unless it asks to take over
(``takeover=True``, ``spark.sparkpoint.takeover=true``). A generation is live while
its status is starting/running with a heartbeat younger than `LIVE_HEARTBEAT_AGE_S`,
and not superseded; one whose driver ran on this host and is gone does not count, nor
one whose stop (or cancel) request completed: after a stop-with-savepoint it only writes
its final status, and the next deploy step (a blue-green green) must not wait for that.

While a zero-downtime cutover of the job is open (`checkpoints.cutover`: planned, green's
claim not decided, not ended), every start is refused, takeover or not: the job's next generation is green's,
claimed by the cutover itself (`runtime.cutover.adopt`), and a retry of blue's task that
took it would race that claim. A start that names the open cutover
(``spark.sparkpoint.cutover``, green's own) passes this rule.

The check is not atomic with the claim: two starts racing within moments of each other
can still fence one another (the later claim wins, as before); green's claim takes exactly
blue's generation + 1, so a start that slipped past this check before the plan was
written ends the cutover instead of racing it.
"""

from __future__ import annotations

import socket
import time

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.checkpoints.history import live_status
from airflow_sparkpoint.checkpoints.history_records import AirflowTry, read_generation
from airflow_sparkpoint.exceptions import CutoverError, CutoverInProgress, JobAlreadyRunning
from airflow_sparkpoint.runtime.livedir import process_alive

__all__ = ["LIVE_HEARTBEAT_AGE_S", "check_no_cutover", "check_start"]

#: a running generation whose heartbeat is older is dead (the heartbeat is written every
#: control.pollInterval, 2 s by default); the operators' max_heartbeat_age default
LIVE_HEARTBEAT_AGE_S = 60.0


def check_start(catalog: Catalog, starter: AirflowTry | None, *, takeover: bool,
                max_heartbeat_age: float = LIVE_HEARTBEAT_AGE_S, now: float | None = None,
                cutover: str | None = None, shadow: bool = False) -> None:
    """Refuse to start job `catalog.job` for `starter` (the task try starting it; None
    outside Airflow) while a cutover other than `cutover` is open, or while another
    task's generation is live. Reads only.

    :param shadow: the start is a shadow of the job (``spark.sparkpoint.shadow.mode``, a
        zero-downtime green): it claims nothing of the job's own (its generations are the
        shadow catalog's; the cutover's claim takes the job's next one), so only the
        open-cutover rule applies to it.

    :raises CutoverInProgress: a cutover of the job is open (planned, not done), whatever
        `takeover` says; the message names it and the way out.
    :raises JobAlreadyRunning: a live generation another task instance (or none)
        started, and not `takeover`; the message names it (generation, task and DAG run,
        host and pid, heartbeat age) and the ways out.
    """
    check_no_cutover(catalog, cutover)
    if takeover or shadow:
        return
    now = time.time() if now is None else now
    status = live_status(catalog, max_heartbeat_age, now=now)
    if status is None:
        return
    if status.host == socket.gethostname() and status.pid and not process_alive(int(status.pid), None):
        return  # its driver ran here and is gone (killed): its heartbeat is merely recent
    if ControlChannel(catalog).stopped(status.generation):
        return  # stopped with a savepoint (or cancelled): ending, its final status follows
    running = read_generation(catalog, status.generation, status=status, current=status.generation).airflow
    if starter is not None and starter.same_task(running):
        return  # a retry or a clear of the task that runs it: takes over, as always
    age = max(0.0, now - float(status.heartbeat_at))
    by = _describe(running)
    me = _describe(starter)
    raise JobAlreadyRunning(
        f"job {catalog.job!r} is already running: generation {status.generation} "
        f"({status.state}), started by "
        f"{by}, on host {status.host or '?'} pid {status.pid or '?'}, heartbeat {age:.0f} s ago; this start "
        f"(by {me}) would fence it. Stop it first (`sparkpoint savepoint --stop`, or "
        "SparkpointSavepointOperator(stop=True)), or take it over on purpose: takeover=True on the operator "
        "(spark.sparkpoint.takeover=true for a manual start)"
    )


def check_no_cutover(catalog: Catalog, allowed: str | None = None) -> None:
    """Refuse a start of `catalog.job` while a cutover other than `allowed` is open and
    not yet claimed by its green (after the claim the job is green's; the usual rules apply).

    :raises CutoverInProgress: one is open, or its records are unreadable (fails closed).
    """
    try:
        state = CutoverStore(catalog).open_cutover()
    except CutoverError as exc:
        raise CutoverInProgress(f"job {catalog.job!r} cannot start: its cutover records are unreadable "
                                f"({exc}); a start might race an open cutover") from None
    if state is None or state.id == allowed:
        return
    if state.taken is not None:  # green's claim was decided: the job is green's, no claim left to race
        return
    raise CutoverInProgress(
        f"job {catalog.job!r} is in zero-downtime cutover {state.id} ({state.step}, blue generation "
        f"{state.plan.blue_generation}): only its green takes the job's next generation. Wait for the "
        f"cutover to end, or call it off first (`sparkpoint cutover call-off {state.id}`), then start "
        "the job again"
    )


def _describe(task: AirflowTry | None) -> str:
    if task is None:
        return "no Airflow task (a manual or CLI start)"
    return f"Airflow task {task.describe()} of DAG run {task.run_id or '?'}"
