"""Cluster deploy mode of `SparkpointSubmitOperator` on Kubernetes and YARN (issue #50):
the driver runs on the cluster, the catalog tracks it, the cluster manager kills it.

1. `run`: spark-submit with ``waitAppCompletion=false`` (it returns once the driver is
   submitted; the Spark provider's own cluster-mode path, its ``execute_resumable``, is
   never entered), the driver's place read from its output
   (`services.cluster_manager.submit`) and recorded in the task state store and in the
   catalog's launch record (`sparkpoint status` shows it); the submit token and the
   Airflow try reach the driver through the provider's ``env_vars`` (which it passes as
   ``spark.kubernetes.driverEnv.*`` / ``spark.yarn.appMasterEnv.*``). Then the task waits
   for the driver's generation claim and publishes it (the launch sequence of both deploy
   modes: `services.driver_claim.record_and_await_claim`), and either defers to
   `SparkpointRunTrigger` (``deferrable``) or follows the run through the catalog right
   here (`services.follow.RunFollower`: status, heartbeat, superseded; the cluster manager
   says when the driver is gone). Both end as a client-mode run ends
   (`submit_deferred.complete`).
2. `stop` (``on_kill``): a control cancel to the run's generation first, then, once
   `stop_timeout` has passed without its end, the cluster manager's kill (delete the driver
   pod; YARN's ``PUT .../state KILLED``). Never a signal to a process: the driver is not here.

A retry fences by generation as for client mode: its driver's claim supersedes a driver
still running on the cluster, which fails at its next checkpoint or commit.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.hooks.spark_cluster import cluster_manager
from airflow_sparkpoint.operators.driver_errors import submit_failure
from airflow_sparkpoint.operators.submit_deferred import (
    DeferringSubmit,
    complete,
    deadline_of,
    defer,
    never_expire,
)
from airflow_sparkpoint.operators.submit_publish import found, push_history_link
from airflow_sparkpoint.services.cluster_manager import (
    WAIT_APP_COMPLETION,
    ClusterHandle,
    submit,
)
from airflow_sparkpoint.services.detached_run import DetachedRecord
from airflow_sparkpoint.services.driver_claim import no_driver_named, record_and_await_claim
from airflow_sparkpoint.services.follow import RunFollower, StartedRun
from airflow_sparkpoint.services.runs import AirflowTry
from airflow_sparkpoint.services.spark_env import cluster_submit_environment
from airflow_sparkpoint.services.stores import Catalog
from airflow_sparkpoint.services.submit import driver_environment, secret_environment
from airflow_sparkpoint.services.submit_dir import open_submit_dir, with_runtime_zip

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook
    from airflow_sparkpoint.operators.try_state import TryState

__all__ = ["ClusterSubmit", "run", "stop"]


class ClusterSubmit(DeferringSubmit, Protocol):
    """What this module uses of `SparkpointSubmitOperator` beyond a deferring submit (what
    the try started is its `TryState`, never the operator's; ``_conn_id`` is the Spark
    provider's)."""

    application: str
    cluster_kind: str | None
    conf: Any
    env_vars: Any
    py_files: Any
    ship_runtime: bool
    stop_timeout: float
    deferrable: bool
    _conn_id: str

    def _build_hook(self) -> SparkpointSubmitHook: ...


def _prepare(op: ClusterSubmit, state: TryState, kind: str, token: str, starter: AirflowTry) -> None:
    """The conf and environment of a cluster-mode submit (no secret in spark-submit's)."""
    op.conf = {**(op.conf or {}), WAIT_APP_COMPLETION[kind]: "false"}
    # The driver's environment: the provider passes env_vars to it on K8s and YARN. The token is
    # not a secret (it only names the submit); the store's credentials are: they stay out.
    op.env_vars = {**(op.env_vars or {}), **driver_environment(starter, token)}
    if secret_environment(op.sparkpoint_hook.storage_options):
        op.log.info("job %s runs in cluster mode: the driver takes its S3 credentials from the cluster (a "
                    "Kubernetes secret through spark.kubernetes.driver.secretKeyRef.*, a service account or "
                    "instance role, Hadoop's credential providers); the connection's serve the Airflow side "
                    "only (spark-submit's conf, which the Spark UI shows, never carries them)", op.job_name)


def run(op: ClusterSubmit, state: TryState, context: Context, catalog: Catalog, *, token: str, since: int,
        starter: AirflowTry) -> dict[str, Any] | None:
    """Submit in cluster mode, wait for the claim, then defer or follow (see the module
    docstring), the run the task follows itself kept in the try's `state.cluster_run`
    (until it ends or the task defers); the run's result, or its error.

    :raises AirflowException: spark-submit named no driver, or the driver ended or
        claimed nothing before `CLAIM_TIMEOUT_S` (then it is killed); the run's own
        error (`submit_deferred.complete`).
    """
    kind = str(op.cluster_kind)
    _prepare(op, state, kind, token, starter)
    submit_dir = open_submit_dir()  # the shipped runtime zip; spark-submit uploads it before it returns
    try:
        if op.ship_runtime:
            op.py_files = with_runtime_zip(op.py_files, submit_dir.path)
        hook = op._build_hook()  # with the final conf, environment and files
        command = hook._build_spark_submit_command(op.application)
        env = {**os.environ, **cluster_submit_environment({**os.environ, **(op.env_vars or {})}),
               **(hook._env or {})}
        push_history_link(op, context["ti"])
        manager = cluster_manager(kind, op._conn_id, hook)
        submission = submit(command, env, kind=kind, namespace=hook._connection.get("namespace"),
                            on_line=lambda line: op.log.info("%s", hook._mask_cmd(line)))
    finally:
        submit_dir.close()
    driver = submission.driver
    if driver is None:
        raise AirflowException(no_driver_named(op.job_name, kind, submission, hook._mask_cmd))
    if submission.exit_code:
        op.log.warning("spark-submit of job %s exited %d after submitting %s: following it", op.job_name,
                       submission.exit_code, driver.describe())
    handle = ClusterHandle(manager, driver)
    state.cluster_run = StartedRun(catalog, handle)
    cluster = {"driver": driver.to_json(), "conn_id": op._conn_id}
    op.log.info("job %s submitted in cluster mode: %s", op.job_name, driver.describe())
    record = DetachedRecord(generation=None, token=token, since=since, process=None, cluster=cluster,
                            deadline=deadline_of(op) if op.deferrable else None)
    outcome = record_and_await_claim(catalog, handle, record, job=op.job_name,
                                     store=context.get("task_state_store"), retention=never_expire(),
                                     log=op.log, publish=lambda claim: found(op, context["ti"], claim))
    claim = outcome.claim
    if claim is None:
        state.cluster_run = None
        failed = submit_failure(op, catalog, token, since) if outcome.ended else None
        raise failed or AirflowException(outcome.message)
    generation = claim.generation
    if op.deferrable:
        state.cluster_run = None  # deferred: the trigger owns the stop now
        defer(op, context, generation=generation, token=token, since=since, process=None,
              deadline=record["deadline"], cluster=cluster)
    state.cluster_run = StartedRun(catalog, handle, generation)
    follower = RunFollower(catalog, generation, op.dead_after, handle)
    op.log.info("job %s generation %d runs on the cluster (%s): following it through the catalog",
                op.job_name, generation, driver.describe())
    event = follower.until_ended(op.poll_interval)
    state.cluster_run = None
    return complete(op, context, event, generation=generation, token=token, since=since)


def stop(op: ClusterSubmit, state: TryState) -> bool:
    """``on_kill`` in cluster mode: end the run the task follows, if any (the try's
    `state.cluster_run`: `services.follow.StartedRun.stop`: a control cancel to its
    generation, up to `stop_timeout` seconds for its end, then the cluster manager's kill;
    before the claim the kill only), what it did logged; whether there was one (none: no
    driver of this task runs on the cluster). Never raises."""
    cluster_run = state.cluster_run
    if cluster_run is None:
        return False
    by = f"SparkpointSubmitOperator {op.task_id!r} (on_kill)"
    for line in cluster_run.stop(wait_s=op.stop_timeout, requested_by=by):
        op.log.info("stopping job %s: %s", op.job_name, line)
    state.cluster_run = None
    return True
