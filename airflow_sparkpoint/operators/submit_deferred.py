"""The deferrable path of `SparkpointSubmitOperator` (``deferrable=True``): the driver runs
detached from the task, the task defers to `SparkpointRunTrigger`, and the worker slot is
free while the job runs.

1. `reattach`: a resumption of the task (a retry, a worker lost before it deferred) whose
   own run is still live, with no stop or cancel addressed to it, defers on that run
   again instead of starting (and so fencing) a new generation.
2. `launch_and_defer`: spark-submit starts through the detached launcher in a session of
   its own (`services.detached.launch`), with the submission directory's lock handed over;
   the task waits for the driver's generation claim, publishes the same XComs as an
   attached run, records where the driver runs in the task state store (Airflow 3.3+,
   never expiring) and defers.
3. `complete` (``execute_complete``): validates the trigger's event (an untrusted dict)
   and ends as an attached run ends.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.operators.driver_errors import DriverOutput, run_failure
from airflow_sparkpoint.operators.submit_publish import found
from airflow_sparkpoint.services.cluster_manager import cluster_record
from airflow_sparkpoint.services.detached import DriverProcess, launch, stop_group
from airflow_sparkpoint.services.follow import EVENT_STATUSES, reattach_target, wait_for_claim
from airflow_sparkpoint.services.runs import AirflowTry, record_launch, task_try
from airflow_sparkpoint.services.stores import Catalog
from airflow_sparkpoint.services.submit_dir import SubmitDir
from airflow_sparkpoint.triggers.run import MIN_POLL_INTERVAL_S, SparkpointRunTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook

__all__ = ["CLAIM_TIMEOUT_S", "DETACHED_KEY", "DeferringSubmit", "DetachedRecord", "check_event",
           "complete", "deadline_of", "defer", "launch_and_defer", "never_expire", "reattach"]

#: the task state store key of the detached run's record
DETACHED_KEY = "sparkpoint_detached"
#: how long the task waits for the detached driver's generation claim before it gives up
CLAIM_TIMEOUT_S = 600.0
#: the driver log's last bytes read for its error when it ends before claiming
_LOG_TAIL_BYTES = 256 * 1024
#: of which the last lines go to the task log
_LOG_TAIL_LINES = 60


class DeferringSubmit(Protocol):
    """What this module uses of `SparkpointSubmitOperator` (it imports this module)."""

    job_name: str
    spark_history_server: str | None
    sparkpoint_run: dict[str, Any] | None
    dag_id: str
    task_id: str
    checkpoint_dir: str | None
    sparkpoint_conn_id: str | None
    application: str
    poll_interval: float
    dead_after: float
    execution_timeout: timedelta | None
    _hook: Any
    _detached: Any

    @property
    def sparkpoint_hook(self) -> Any: ...

    @property
    def log(self) -> Any: ...

    def _get_hook(self) -> SparkpointSubmitHook: ...

    def _catalog(self) -> Catalog: ...

    def _run_failure(self, catalog: Catalog, token: str, after: int) -> AirflowException | None: ...

    def _finish(self, context: Context, catalog: Catalog, generation: int) -> dict[str, Any] | None: ...

    def defer(self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None,
              timeout: timedelta | None = None) -> NoReturn: ...


class DetachedRecord(dict):  # type: ignore[type-arg]
    """The detached run a task follows, as kept in the task state store:
    ``generation``, ``token``, ``since``, ``deadline`` and where the driver runs: ``process``
    (`DriverProcess.to_json`, client mode) or ``cluster`` (cluster mode: ``driver``,
    `ClusterDriver.to_json`, and ``conn_id``, the Spark connection whose cluster manager
    watches and kills it)."""

    @classmethod
    def load(cls, store: Any) -> DetachedRecord | None:
        """The record in `store` (None: no store, no record or an unreadable one)."""
        if store is None:
            return None
        try:
            raw = store.get(DETACHED_KEY)
            raw = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(raw, dict) or not isinstance(raw.get("generation"), (int, type(None))):
                return None
            if raw.get("cluster") is not None:
                cluster_record(raw["cluster"])
            else:
                DriverProcess.from_json(raw.get("process"))
            return cls(raw)
        except (ConfigError, ValueError, TypeError, AttributeError, KeyError):
            return None
        except Exception:  # noqa: BLE001 - the store's transport: bookkeeping never fails the run
            return None

    def save(self, store: Any, log: Any) -> None:
        if store is None:
            return
        try:
            store.set(DETACHED_KEY, dict(self), retention=never_expire())
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            log.warning("could not write the task state record %r: %s", DETACHED_KEY, exc)


def never_expire() -> Any:
    """Airflow 3.3's task state store retention that never expires (a streaming job outlives
    the store's default 30 days), or None where there is none."""
    try:
        from airflow.sdk.execution_time.context import NEVER_EXPIRE
    except ImportError:
        return None
    return NEVER_EXPIRE


def _task(op: DeferringSubmit, context: Context) -> dict[str, Any]:
    """The task instance `on_kill` asks the state of (the identity its driver records)."""
    me = task_try(context, op.dag_id, op.task_id)
    return {"dag_id": me.dag_id, "task_id": me.task_id, "run_id": me.run_id,
            "map_index": -1 if me.map_index is None else me.map_index}


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
    where = (process.describe() if process else cluster_record(cluster)[0].describe() if cluster
             else "driver not recorded")
    op.log.info("job %s generation %d runs detached (%s); deferring", op.job_name, generation, where)
    op.defer(trigger=trigger, method_name="execute_complete",
             kwargs={"generation": generation, "token": token, "since": since})


def reattach(op: DeferringSubmit, context: Context, catalog: Catalog, starter: AirflowTry,
             own: list[int] | None) -> None:
    """Defer on the task's own live run when there is one (see the module docstring); else
    return and let the task start a new generation."""
    store = context.get("task_state_store")
    record = DetachedRecord.load(store)
    status = reattach_target(catalog, starter, own=own, max_heartbeat_age=op.dead_after)
    if status is None:
        return
    process = cluster = None
    token, since, deadline = "", status.generation - 1, deadline_of(op)
    claim = catalog.generation_claim(status.generation)
    # the record of the launch names this run: by generation, or (a worker lost before the
    # claim came) by the submit token the driver recorded in its claim
    if record is not None and (record["generation"] == status.generation or (
            claim is not None and record.get("token") and claim.submitter == record.get("token"))):
        if record.get("cluster") is not None:
            cluster = record["cluster"]
        else:
            process = DriverProcess.from_json(record["process"])
        token, since = str(record.get("token") or ""), int(record.get("since") or since)
        deadline = record.get("deadline") if isinstance(record.get("deadline"), (int, float)) else deadline
    if claim is not None:
        found(op, context["ti"], claim)
        token = token or claim.submitter
    op.log.info("job %s generation %d, started by an earlier try of this task, is live: following it again "
                "instead of starting a new generation", op.job_name, status.generation)
    defer(op, context, generation=status.generation, token=token, since=since, process=process,
          deadline=deadline, cluster=cluster)


def launch_and_defer(op: DeferringSubmit, context: Context, catalog: Catalog, *, token: str,
                     since: int, submit_dir: SubmitDir) -> NoReturn:
    """Start the driver detached, wait for its claim, publish it and defer (see the module
    docstring).

    :raises AirflowException: the driver ended, or claimed nothing within
        `CLAIM_TIMEOUT_S` (then it is stopped), with its own error where it gave one.
    """
    hook = op._get_hook()
    op._hook = hook
    command = hook._build_spark_submit_command(op.application)
    env = {**os.environ, **(hook._env or {})}
    log_path = os.path.join(submit_dir.path, "driver.log")
    process = launch(command, env, log_path=log_path, keep_fd=submit_dir.lock_fd)
    op._detached = process
    store = context.get("task_state_store")
    record = DetachedRecord(generation=None, token=token, since=since, process=process.to_json(),
                            deadline=deadline_of(op))
    record.save(store, op.log)  # at once: a worker lost before the claim leaves its retry the process
    submit_dir.hand_over()  # the launcher holds the lock now; the directory outlives this task
    op.log.info("spark-submit of job %s started detached: %s", op.job_name, process.describe())
    message = record_launch(catalog, token, deploy_mode="client",
                            driver={"kind": "process", "host": process.host, "pgid": process.pgid,
                                    "log": process.log})
    if message:
        op.log.warning("%s", message)
    waited = wait_for_claim(catalog, token, since, process, timeout_s=CLAIM_TIMEOUT_S, warn=op.log.warning)
    claim = waited.claim
    if claim is None and waited.why == "ended":
        output = _driver_output(process.log, op.log)
        failed = run_failure(op.job_name, catalog, token, since, output=output, exit_code=None,
                             scrub=op.sparkpoint_hook.scrub)
        raise failed or AirflowException(
            f"job {op.job_name!r}: the detached spark-submit ended before its driver claimed a "
            f"generation (its output: {process.log})")
    if claim is None:
        op.log.error("stopping job %s: %s", op.job_name, stop_group(process))
        raise AirflowException(f"job {op.job_name!r}: the detached driver claimed no generation within "
                               f"{CLAIM_TIMEOUT_S:.0f} s; stopped it ({process.describe()})")
    found(op, context["ti"], claim)
    record = DetachedRecord({**record, "generation": claim.generation})
    record.save(store, op.log)
    op._detached = None  # deferred: the trigger owns the stop now
    defer(op, context, generation=claim.generation, token=token, since=since, process=process,
          deadline=record["deadline"])


def _driver_output(log_path: str, log: Any) -> DriverOutput:
    """What the driver said about its failure, from the end of its log file; its last
    lines go to the task log (a detached driver's output is not there otherwise)."""
    output = DriverOutput()
    try:
        with open(log_path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - _LOG_TAIL_BYTES))
            lines = list(output.watch(handle.read().decode(errors="replace").splitlines()))
    except OSError as exc:
        log.warning("cannot read the detached driver's output %s: %s", log_path, exc)
        return output
    log.info("the detached driver's last output lines (%s):\n%s", log_path,
             "\n".join(lines[-_LOG_TAIL_LINES:]))
    return output


def check_event(event: Any, generation: int) -> dict[str, Any]:
    """The trigger's event, validated: a mapping with a known status, for `generation`.

    :raises AirflowException: anything else (the event is untrusted input).
    """
    if not isinstance(event, Mapping):
        raise AirflowException(f"malformed Sparkpoint run event {event!r}: expected a dict")
    if event.get("status") not in EVENT_STATUSES:
        raise AirflowException(f"malformed Sparkpoint run event {dict(event)!r}: status "
                               f"{event.get('status')!r}, expected one of {', '.join(EVENT_STATUSES)}")
    if event.get("generation") != generation:
        raise AirflowException(f"Sparkpoint run event {dict(event)!r} is for generation "
                               f"{event.get('generation')!r}; this task follows generation {generation}")
    return dict(event)


def complete(op: DeferringSubmit, context: Context, event: Any, *, generation: int, token: str,
             since: int) -> dict[str, Any] | None:
    """``execute_complete``: end as an attached run ends (result, XCom, asset events), or
    raise the run's own error.

    :raises SparkpointRunFailed: the run failed (its own error).
    :raises AirflowTaskTimeout: the run passed ``execution_timeout`` (the trigger stopped it).
    :raises AirflowException: the driver died (names the generation and the silence bound),
        or a malformed event.
    """
    event = check_event(event, generation)
    catalog = op._catalog()
    message = str(event.get("message") or "")
    if event["status"] != "success" and isinstance(event.get("log"), str) and event.get("log"):
        op.log.info("the detached driver's output is %s on host %s", event["log"], event.get("host") or "?")
    if event["status"] != "success" and isinstance(event.get("driver"), str) and event.get("driver"):
        op.log.info("the driver ran on the cluster as %s (its log is the cluster's)", event["driver"])
    if event["status"] == "timeout":
        raise AirflowTaskTimeout(message or f"job {op.job_name!r} generation {generation} timed out")
    if event["status"] == "dead":
        bound = event.get("dead_after")
        bound_text = f"{bound:.0f}" if isinstance(bound, (int, float)) else "?"
        raise AirflowException(message or f"the driver of job {op.job_name!r} generation {generation} is "
                                          f"silent for more than {bound_text} s: declared dead")
    if event["status"] == "failed":
        failed = op._run_failure(catalog, token, since) if token else None
        raise failed or AirflowException(f"job {op.job_name!r} generation {generation} failed: {message}")
    claim = catalog.generation_claim(generation)
    if claim is not None:
        found(op, context["ti"], claim)
    return op._finish(context, catalog, generation)
