"""The deferral of `SparkpointSubmitOperator` (``deferrable=True``), client and cluster
deploy mode alike: once the driver runs detached from the task (`submit_client`'s detached
launch, `submit_cluster`'s submit) the task defers to `SparkpointRunTrigger`, and the
worker slot is free while the job runs. The decisions are the services'
(`services.detached_run`: the task's record of the run, the resumption, the event's
meaning); here they become XComs, a deferral or an exception.

1. `defer`: defer on a claimed generation, its driver a detached process group or a
   driver on the cluster, the deferring try recorded in the task state store.
2. `reattach`: a resumption of the task (a retry, a worker lost before it deferred) whose
   own run is still live, with no stop or cancel addressed to it, defers on that run
   again instead of starting (and so fencing) a new generation; when a stop or cancel is
   ending that run (a clear: the cleared try's trigger cancelled it), `wait_out` waits
   for its end and the task starts anew (`resume`: both, then the try prepared again).
3. `complete` (``execute_complete``): validates the trigger's event (an untrusted dict)
   and ends as an attached run ends; a run the task re-attached to that a cleared
   earlier try's trigger then cancelled (`services.detached_run.cleared_stop`) is not the
   task's end: the task starts the job again (``execute``), as a cleared attached task does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.hooks.spark_cluster import cluster_handle
from airflow_sparkpoint.operators.driver_errors import FailedSubmit, submit_failure
from airflow_sparkpoint.operators.submit_publish import Finishing, finish, found
from airflow_sparkpoint.services.cluster_manager import cluster_record
from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.detached_run import (
    CLAIM_TIMEOUT_S,
    DETACHED_KEY,
    DetachedRecord,
    Resumption,
    event_problem,
    followed_end,
    resumption,
    stop_cleared_run,
    wait_out_stopping_run,
)
from airflow_sparkpoint.services.runs import AirflowTry, task_try
from airflow_sparkpoint.services.stores import Catalog
from airflow_sparkpoint.services.submit_try import PreparedTry
from airflow_sparkpoint.triggers.run import MIN_POLL_INTERVAL_S, STOP_WAIT_S, SparkpointRunTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["CLAIM_TIMEOUT_S", "DETACHED_KEY", "DeferringSubmit", "DetachedRecord", "check_event",
           "complete", "deadline_of", "defer", "never_expire", "reattach", "resume", "wait_out"]


class DeferringSubmit(Finishing, FailedSubmit, Protocol):
    """What this module uses of `SparkpointSubmitOperator` (it imports this module)."""

    job_name: str
    spark_history_server: str | None
    sparkpoint_run: dict[str, Any] | None
    task_id: str
    checkpoint_dir: str | None
    sparkpoint_conn_id: str | None
    poll_interval: float
    dead_after: float
    execution_timeout: timedelta | None

    @property
    def dag_id(self) -> str: ...  # BaseOperator's, read-only

    @property
    def sparkpoint_hook(self) -> Any: ...

    @property
    def log(self) -> Any: ...

    def execute(self, context: Context) -> dict[str, Any] | None: ...

    def _catalog(self) -> Catalog: ...

    def defer(self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None,
              timeout: timedelta | None = None) -> NoReturn: ...


def never_expire() -> Any:
    """Airflow 3.3's task state store retention that never expires (a streaming job outlives
    the store's default 30 days), or None where there is none."""
    try:
        from airflow.sdk.execution_time.context import NEVER_EXPIRE
    except ImportError:
        return None
    return NEVER_EXPIRE


def _task(op: DeferringSubmit, context: Context) -> dict[str, Any]:
    """The task instance `on_kill` asks the state of (the identity its driver records), in
    the trigger's ``task`` form (`services.detached_run.user_stop_by` reads it)."""
    me = task_try(context, op.dag_id, op.task_id)
    return {"dag_id": me.dag_id, "task_id": me.task_id, "run_id": me.run_id,
            "map_index": -1 if me.map_index is None else me.map_index, "try_number": me.try_number}


def deadline_of(op: DeferringSubmit) -> float | None:
    timeout = op.execution_timeout
    if isinstance(timeout, timedelta):
        return time.time() + timeout.total_seconds()
    return None


def defer(op: DeferringSubmit, context: Context, *, generation: int, token: str, since: int,
          process: DriverProcess | None, deadline: float | None,
          cluster: Mapping[str, Any] | None = None) -> NoReturn:
    """Defer on run `generation` (`SparkpointRunTrigger`), its driver a detached `process`
    or on the `cluster` (a `DetachedRecord`'s ``cluster``) or not known (neither)."""
    trigger = SparkpointRunTrigger(
        job_name=op.job_name, generation=generation, checkpoint_dir=op.checkpoint_dir,
        sparkpoint_conn_id=op.sparkpoint_conn_id, process=None if process is None else process.to_json(),
        cluster=None if cluster is None else dict(cluster),
        task=_task(op, context), poll_interval=max(op.poll_interval, MIN_POLL_INTERVAL_S),
        dead_after=op.dead_after, deadline=deadline)
    store = context.get("task_state_store")
    record = DetachedRecord.load(store)
    if record is not None:  # a later try that finds this run live knows this try deferred on it
        record.deferring(generation, task_try(context, op.dag_id, op.task_id).try_number or 1).save(
            store, op.log, retention=never_expire())
    where = (process.describe() if process else cluster_record(cluster)[0].describe() if cluster
             else "driver not recorded")
    op.log.info("job %s generation %d runs detached (%s); deferring", op.job_name, generation, where)
    op.defer(trigger=trigger, method_name="execute_complete",
             kwargs={"generation": generation, "token": token, "since": since})


def reattach(op: DeferringSubmit, context: Context, catalog: Catalog, starter: AirflowTry,
             own: list[int] | None, record: DetachedRecord | None) -> None:
    """Defer on the task's own live run when there is one (`services.detached_run.resumption`,
    with the task's `record` of its run); else return and let the task start a new generation."""
    again = resumption(catalog, starter, own=own, record=record, dead_after=op.dead_after,
                       deadline=lambda: deadline_of(op))
    if again is None:
        return
    if again.cleared is not None:  # a clear: stop the run as the cleared try's trigger does, then start anew
        _stop_cleared(op, context, catalog, again)
        return
    found(op, context["ti"], again.claim)
    op.log.info("job %s generation %d, started by an earlier try of this task, is live: following it again "
                "instead of starting a new generation", op.job_name, again.generation)
    defer(op, context, generation=again.generation, token=again.token, since=again.since,
          process=again.process, deadline=again.deadline, cluster=again.cluster)


def _stop_cleared(op: DeferringSubmit, context: Context, catalog: Catalog, run: Resumption) -> None:
    """Stop run `run`, on which try `run.cleared` of this task deferred before it was
    cleared (`services.detached_run.stop_cleared_run`), its driver reached through the
    cluster manager of its record in cluster mode (the new try may defer before the
    triggerer's question about the task's state is answered)."""
    driver: Any = run.process
    if run.cluster is not None:
        try:
            driver = cluster_handle(run.cluster)
        except ConfigError as exc:
            op.log.warning("cannot reach the cluster manager of job %s's driver (%s): stopped by a control "
                           "request only", op.job_name, exc)
            driver = None
    stop_cleared_run(catalog, run, driver, job=op.job_name, task=_task(op, context), wait_s=STOP_WAIT_S,
                     log=op.log)


def wait_out(op: DeferringSubmit, catalog: Catalog, starter: AirflowTry, own: list[int] | None,
             record: DetachedRecord | None) -> bool:
    """Wait for the end of the task's own live run that a stop or cancel is ending
    (`services.detached_run.wait_out_stopping_run`: a clear whose trigger's cancel came
    before this try looked); whether there was one (then the try plans its restore again:
    the ended run's last checkpoint counts)."""
    lines = wait_out_stopping_run(catalog, starter, own=own, dead_after=op.dead_after, record=record)
    for line in lines:
        op.log.info("%s", line)
    return bool(lines)


def resume(op: DeferringSubmit, context: Context, catalog: Catalog, starter: AirflowTry,
           prepared: PreparedTry) -> PreparedTry:
    """A deferrable try before its start: it defers on the task's own live run (`reattach`:
    never returns then); else, once the task's run that a stop or cancel was ending has
    ended (`wait_out`), the try prepared again (that run's last checkpoint counts); else
    `prepared`.

    :raises ConfigError: a setting is invalid (the try prepared again).
    :raises StorageError: the store cannot be read.
    """
    record = DetachedRecord.load(context.get("task_state_store"))  # neither step changes it
    reattach(op, context, catalog, starter, prepared.own, record)
    # a clear whose cancel came first: its dying run ended, and its last checkpoint counts
    if wait_out(op, catalog, starter, prepared.own, record):
        return prepared.again(catalog, context.get("task_state_store"), logger=op.log)
    return prepared


def check_event(event: Any, generation: int) -> dict[str, Any]:
    """The trigger's event, validated (`services.detached_run.event_problem`).

    :raises AirflowException: anything else (the event is untrusted input).
    """
    problem = event_problem(event, generation)
    if problem is not None:
        raise AirflowException(problem)
    return dict(event)


def complete(op: DeferringSubmit, context: Context, event: Any, *, generation: int, token: str,
             since: int) -> dict[str, Any] | None:
    """``execute_complete``: end as an attached run ends (result, XCom, asset events), or
    raise the run's own error (`services.detached_run.run_end`).

    :raises SparkpointRunFailed: the run failed (its own error).
    :raises AirflowTaskTimeout: the run passed ``execution_timeout`` (the trigger stopped it).
    :raises AirflowException: the driver died (names the generation and the silence bound),
        or a malformed event.
    """
    event = check_event(event, generation)
    catalog = op._catalog()
    end = followed_end(catalog, event, job=op.job_name, generation=generation,
                       starter=task_try(context, op.dag_id, op.task_id))
    for note in end.notes:
        op.log.info("%s", note)
    if end.status == "timeout":
        raise AirflowTaskTimeout(end.message)
    if end.status == "dead":
        raise AirflowException(end.message)
    if end.status == "failed":
        failed = submit_failure(op, catalog, token, since) if token else None
        raise failed or AirflowException(end.message)
    if end.status == "cleared":
        op.log.info("%s", end.message)
        op.sparkpoint_run = None  # the new run's claim is published again
        return op.execute(context)
    found(op, context["ti"], catalog.generation_claim(generation))
    return finish(op, context, catalog, generation)
