"""Client deploy mode of `SparkpointSubmitOperator`: spark-submit, and with it the driver,
runs on this worker.

1. `run`: the submit's worker-side environment (the store's credentials and the submit
   token in spark-submit's environment only, `SPARK_HOME` and the driver's Python, the
   driver's RocksDB library directory, the shipped runtime on ``--py-files``), in a
   submission directory of its own (`services.submit_dir`). With ``deferrable`` the
   driver then starts detached (`launch_and_defer`); else spark-submit runs as the task's
   child (the Spark provider's own execute), the run's claim is published as soon as the
   driver records it (`services.runs.RunWatcher`), a failure is the run's own error
   (`driver_errors.submit_failure`) rather than the hook's exit code, and its end is the
   task's result, as a cluster-mode or deferred run's (`submit_publish.finish`).
2. `launch_and_defer`: spark-submit starts through the detached launcher in a session of
   its own (`services.detached.launch`), with the submission directory's lock handed over;
   the task records where the driver runs in the task state store (Airflow 3.3+, never
   expiring), waits for the driver's generation claim and publishes the same XComs as an
   attached run (the launch sequence of both deploy modes:
   `services.driver_claim.record_and_await_claim`), then defers (`submit_deferred.defer`).
3. `stop` (``on_kill``): a driver launched detached that the task has not deferred on
   yet is killed by its process group (`services.detached.stop_group`); an attached
   spark-submit and its children get SIGTERM, `stop_timeout` seconds, then the Spark
   hook's own kill (`services.processes.terminate_tree`). Never a control request: it
   would outlive the driver and stop a later run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.operators.driver_errors import run_failure, submit_failure
from airflow_sparkpoint.operators.submit_deferred import DeferringSubmit, deadline_of, defer, never_expire
from airflow_sparkpoint.operators.submit_publish import finish, found, push_history_link
from airflow_sparkpoint.services.detached import launch, stop_group
from airflow_sparkpoint.services.detached_run import DetachedRecord
from airflow_sparkpoint.services.driver_claim import record_and_await_claim
from airflow_sparkpoint.services.processes import terminate_tree
from airflow_sparkpoint.services.runs import AirflowTry, RunWatcher, find_claim
from airflow_sparkpoint.services.spark_env import spark_environment
from airflow_sparkpoint.services.stores import Catalog
from airflow_sparkpoint.services.submit import driver_environment, secret_environment
from airflow_sparkpoint.services.submit_dir import (
    ROCKSDB_LIBRARY_DIR_ENV,
    SubmitDir,
    open_submit_dir,
    with_runtime_zip,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook
    from airflow_sparkpoint.operators.try_state import TryState

__all__ = ["ClientSubmit", "launch_and_defer", "run", "stop", "submit_environment"]

class ClientSubmit(DeferringSubmit, Protocol):
    """What this module uses of `SparkpointSubmitOperator` beyond a deferring submit (what
    the try started is its `TryState`, never the operator's; ``_hook``, read here, is the
    Spark provider's)."""

    application: str
    env_vars: Any
    py_files: Any
    ship_runtime: bool
    stop_timeout: float
    deferrable: bool
    conf: Any

    def _get_hook(self) -> SparkpointSubmitHook: ...

    def _build_hook(self) -> SparkpointSubmitHook: ...


def run(op: ClientSubmit, state: TryState, context: Context, catalog: Catalog, *, token: str, since: int,
        starter: AirflowTry, spark_submit: Callable[[Context], Any]) -> dict[str, Any] | None:
    """Run the submit on this worker, what it starts kept in the try's `state`: detached and
    deferred (never returns then), or as the task's child through `spark_submit` (the Spark
    provider's execute, which builds the provider's hook: the operator left none) until it ends; then
    the run's end (`submit_publish.finish`: its result), or None when the job claimed no
    generation (logged).

    :raises SparkpointRunFailed: the run failed and reported its own error.
    :raises AirflowException: spark-submit failed without one (the hook's error), or the
        detached driver did not claim (`launch_and_defer`).
    """
    ti = context["ti"]
    state.secret_env = {**secret_environment(op.sparkpoint_hook.storage_options),
                        **driver_environment(starter, token)}
    master = str(op._get_hook()._connection.get("master") or "")
    submit_dir = open_submit_dir()  # removed when spark-submit has ended (else by a later sweep)
    try:
        # An earlier execute of this object set its own (now removed) directory: not the user's.
        op.env_vars = {k: v for k, v in (op.env_vars or {}).items()
                       if not (k == ROCKSDB_LIBRARY_DIR_ENV and v == state.native_dir)}
        state.native_dir = submit_dir.native_dir
        op.env_vars = {**submit_environment(op, master, native_dir=submit_dir.native_dir), **op.env_vars}
        if op.ship_runtime:
            op.py_files = with_runtime_zip(op.py_files, submit_dir.path)
        push_history_link(op, ti)
        if op.deferrable:
            launch_and_defer(op, state, context, catalog, token=token, since=since, submit_dir=submit_dir)
        watcher = RunWatcher(catalog, token, since, lambda run: found(op, ti, run))
        watcher.start()
    except BaseException:
        submit_dir.close()  # after a hand-over (deferred) it removes nothing
        raise
    try:
        spark_submit(context)
    except AirflowException as exc:
        # The hook's message is only the command and its exit code: the run's own error first.
        reported = submit_failure(op, catalog, token, since)
        if reported is None:
            raise
        raise reported from exc
    finally:
        watcher.stop()
        try:
            found(op, ti, find_claim(catalog, token, after=since))
        except SparkpointError as exc:  # keep the run's own error, if any
            op.log.warning("could not read the generation claims of job %s: %s", op.job_name, exc)
        process = getattr(op._hook, "_submit_sp", None)
        if process is not None and process.stdout is not None:
            process.stdout.close()  # the Spark hook leaves its log pipe open
        submit_dir.close()
    if op.sparkpoint_run is None:
        op.log.warning("job %s ended without claiming a generation (did it call job.run()?)", op.job_name)
        return None
    return finish(op, context, catalog, int(op.sparkpoint_run["generation"]))


def submit_environment(op: ClientSubmit, master: str, *, native_dir: str | None = None) -> dict[str, str]:
    """spark-submit's environment additions (`services.spark_env.spark_environment`), from
    this worker's environment with the task's `env_vars`, its Spark `conf` and its
    ``sparkpoint`` connection's ``pyspark_python``."""
    from_conn = op.sparkpoint_hook.pyspark_python if op.sparkpoint_conn_id else None
    return spark_environment({**os.environ, **(op.env_vars or {})}, op.conf or {}, master,
                             native_dir=native_dir, pyspark_python=from_conn,
                             pyspark_python_from=f"connection {op.sparkpoint_conn_id!r}")


def launch_and_defer(op: ClientSubmit, state: TryState, context: Context, catalog: Catalog, *, token: str,
                     since: int, submit_dir: SubmitDir) -> NoReturn:
    """Start the driver detached (the try's `state.detached` until the task defers), wait
    for its claim, publish it and defer (see the module docstring).

    :raises AirflowException: the driver ended, or claimed nothing within
        `CLAIM_TIMEOUT_S` (then it is stopped), with its own error where it gave one.
    """
    hook = op._build_hook()  # with the final environment and files
    command = hook._build_spark_submit_command(op.application)
    env = {**os.environ, **(hook._env or {})}
    log_path = os.path.join(submit_dir.path, "driver.log")
    process = launch(command, env, log_path=log_path, keep_fd=submit_dir.lock_fd)
    state.detached = process
    submit_dir.hand_over()  # the launcher holds the lock now; the directory outlives this task
    op.log.info("spark-submit of job %s started detached: %s", op.job_name, process.describe())
    record = DetachedRecord(generation=None, token=token, since=since, process=process.to_json(),
                            deadline=deadline_of(op))
    outcome = record_and_await_claim(catalog, process, record, job=op.job_name,
                                     store=context.get("task_state_store"), retention=never_expire(),
                                     log=op.log, publish=lambda claim: found(op, context["ti"], claim))
    claim = outcome.claim
    if claim is None:
        failed = run_failure(op.job_name, catalog, token, since, output=outcome.output, exit_code=None,
                             scrub=op.sparkpoint_hook.scrub) if outcome.ended else None
        raise failed or AirflowException(outcome.message)
    state.detached = None  # deferred: the trigger owns the stop now
    defer(op, context, generation=claim.generation, token=token, since=since, process=process,
          deadline=record["deadline"])


def stop(op: ClientSubmit, state: TryState, *, spark_kill: Callable[[], None]) -> None:
    """End this worker's driver from ``on_kill`` (see the module docstring): the try's
    `state.detached`, else the Spark provider's hook's spark-submit; `spark_kill` is the
    Spark provider's own ``on_kill`` (SIGKILL), called when it built a hook."""
    if state.detached is not None:  # killed before it deferred: end the detached driver too
        op.log.info("job %s: %s", op.job_name, stop_group(state.detached, grace_s=op.stop_timeout))
        state.detached = None
    process = getattr(op._hook, "_submit_sp", None)
    if process is not None and terminate_tree(process, op.stop_timeout):
        op.log.info("spark-submit of job %s ended after SIGTERM (exit %s)", op.job_name, process.returncode)
    if op._hook is not None:
        spark_kill()
