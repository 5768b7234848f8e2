"""`SparkpointSubmitOperator`: spark-submit a checkpointed PySpark job.

A `SparkSubmitOperator` (its parameters keep working) that wires the Sparkpoint
runtime: sets the ``spark.sparkpoint.*`` conf, chooses the restore target (``restore``
on the first try, the latest retained checkpoint of the task's own runs on every retry),
optionally ships the runtime with ``--py-files``, and returns the run result as XCom.
An adapter: its rendered arguments become the job's submit settings, one call prepares
the try (`services.submit_try`: the restore, the plan, the settings, the start), a
deploy-mode module launches it, and its end becomes the XComs and asset events
(`submit_publish.finish`).

Client deploy mode (`submit_client`): the driver runs under the task, so a kill of the
task reaches it (see `on_kill` and `airflow_sparkpoint.runtime.signals`); or, with
``deferrable``, detached from it and followed through the catalog by a trigger
(`submit_deferred`).
Cluster deploy mode on Kubernetes and YARN (`submit_cluster`): the driver runs on the
cluster, the catalog tracks it and the cluster manager kills it; on standalone and
local masters it is refused before anything is submitted (`submit_checks.check_deploy_mode`).

Each submit carries a token (environment ``SPARKPOINT_SUBMITTER``) that the driver
records with its generation claim: the operator finds its own run, result and
application id by it, never by "the newest generation", which another run may hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import XComArg
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators import lineage, submit_client, submit_cluster, submit_deferred
from airflow_sparkpoint.operators.asset_events import AssetAliasAttribute, AssetEvents, AssetEventsAttribute
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute, default_deferrable
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink, SparkpointSparkUILink
from airflow_sparkpoint.operators.submit_checks import SparkpointConfigFailure, check_spark
from airflow_sparkpoint.operators.submit_deferred import never_expire
from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook
from airflow_sparkpoint.operators.try_state import TryState
from airflow_sparkpoint.services.runs import task_try
from airflow_sparkpoint.services.sinks import SinkSpec, declared_sink
from airflow_sparkpoint.services.stores import Catalog
from airflow_sparkpoint.services.submit import check_parameters, interval_text
from airflow_sparkpoint.services.submit_try import SubmitSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.services.sinks import Sink

__all__ = ["SparkpointSubmitOperator"]


class SparkpointSubmitOperator(SparkSubmitOperator):
    """Submit a Sparkpoint PySpark job and return its run result.

    :param job_name: pipeline name (``spark.sparkpoint.job``): the identity of its state
        and of its sink transactions.
    :param checkpoint_dir: storage root (``spark.sparkpoint.dir``); or use `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection giving the storage root, S3
        endpoint/credentials (credentials reach spark-submit through its environment) and
        the cluster's Python (default ``sparkpoint_default`` when no `checkpoint_dir` is given).
    :param restore: ``latest``, ``none`` or a savepoint/checkpoint path for the first try
        (templated: a savepoint path can come from XCom). A retry restores the latest
        checkpoint of the task's own tries, or this path again while they made none.
    :param restore_snapshot: a savepoint or checkpoint path chosen by hand, restored on
        **every** try of this task (a retry or a clear too), where `restore` is used on the
        first try only; empty or None: not set (templated: ``"{{ params.restore }}"``). If
        a try committed output past it, the next try is refused (sink ahead) unless
        ``sparkpoint_conf={"restore.sinkAhead": "rewind"}`` (Delta only).
    :param trigger: ``availableNow`` or ``processingTime:<interval>`` (Spark's interval
        syntax, e.g. ``processingTime:5 seconds``, or ``10s``).
    :param checkpoint_interval: ``spark.sparkpoint.checkpoint.interval``: a duration (seconds,
        a timedelta or a string such as ``"30s"``, ``"5 minutes"``); ``0`` = every batch.
    :param num_retained: completed checkpoints to keep.
    :param commit_mode: ``checkpoint`` or ``external``.
    :param work_dir: ``spark.sparkpoint.workDir`` (Spark's live checkpoint location).
    :param sparkpoint_conf: further ``spark.sparkpoint.*`` settings (without or with prefix).
    :param ship_runtime: zip the pure-Python runtime and add it with ``--py-files``, so a
        cluster needs no install of the provider.
    :param stop_timeout: how long `on_kill` gives the driver to end after SIGTERM (it
        records its failed status at once) before spark-submit is killed (a duration:
        seconds, a timedelta or a string such as ``"3s"``); in cluster mode, after the
        control cancel, before the cluster manager's kill.
    :param spark_history_server: base URL of a Spark History Server: the "Spark UI" link
        points there instead of the driver's live UI.
    :param takeover: start even when the job's live run was started by another task
        instance (another DAG, task or DAG run) or by none (a manual start): that run is
        fenced. Without it such a start is refused before anything is submitted
        (`JobAlreadyRunning`, naming the running generation); a retry or a clear of the
        same task instance always takes its own run over.
    :param state_partitions: restore into this many state partitions instead of the
        snapshot's (``spark.sparkpoint.restore.statePartitions``: a rescale on restore;
        every try passes it, a retry of an already rescaled job finds nothing to do).
    :param sink: the job's sink as the job script declares it (a `Sink` or its config
        mapping with ``kind``), or the `sparkpoint_conn_id` connection's declaration: names
        the output asset (`airflow_sparkpoint.assets`) and the OpenLineage output dataset.
    :param emit_asset_events: when the run committed batches, emit one event of the output
        asset (extra: job, generation, committed batches, sink version); a run that
        committed nothing emits none.
    :param deferrable: run the driver detached and defer to `SparkpointRunTrigger`, which
        follows the run through the catalog (`submit_deferred`; default
        ``[operators] default_deferrable``); `poll_interval`: seconds between its looks
        (>= 10); `dead_after`: a heartbeat older than this on two looks: the driver is dead.

    Returns (XCom) the run result; with key ``generation`` the generation the try ran
    (pushed also when it failed) and with key ``spark_application`` its claim (application
    id, UI URL, host, pid).

    :raises ConfigError: bad settings, or ``deploy_mode="cluster"`` on a master other than
        ``k8s://`` or ``yarn`` or with a store of this worker's disk, before anything runs.
    :raises JobAlreadyRunning: another task's run of the job is live and not `takeover`.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "job_name",
        "checkpoint_dir",
        "restore",
        "restore_snapshot",
        "trigger",
        "checkpoint_interval",
        "work_dir",
        "sparkpoint_conf",
        "spark_history_server",
    )
    operator_extra_links = (SparkpointSparkUILink(), SparkpointCheckpointHistoryLink())
    sparkpoint_hook = JobHookAttribute()  # the job's store, as rendered
    hook = JobHookAttribute(alias=True)
    assets_alias = AssetAliasAttribute()
    _asset_events = AssetEventsAttribute()  # bound to the task it is read on
    emit_asset_events: bool  # set by `AssetEvents.declare`

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        restore: str = "latest",
        restore_snapshot: str | None = None,
        trigger: str = "availableNow",
        checkpoint_interval: str | float | timedelta = "0",
        num_retained: int = 3,
        commit_mode: str = "checkpoint",
        work_dir: str | None = None,
        sparkpoint_conf: Mapping[str, Any] | None = None,
        ship_runtime: bool = False,
        stop_timeout: float | timedelta | str = 3.0,
        spark_history_server: str | None = None,
        state_partitions: int | None = None,
        sink: SinkSpec | None = None,
        emit_asset_events: bool = True,
        takeover: bool = False,
        deferrable: bool | None = None,
        poll_interval: float | timedelta | str = 10.0,
        dead_after: float | timedelta | str = 60.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"sparkpoint-{job_name}")
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        declared_sink(sink)  # a malformed declaration fails when the DAG is parsed
        self.sink = sink
        AssetEvents.declare(self, emit_asset_events)
        check_parameters(commit_mode=commit_mode, num_retained=num_retained,
                         state_partitions=state_partitions, takeover=takeover)
        self.restore = restore
        self.restore_snapshot = restore_snapshot
        self.trigger = trigger
        self.checkpoint_interval = interval_text(checkpoint_interval)
        self.num_retained = num_retained
        self.commit_mode = commit_mode
        self.work_dir = work_dir
        # a mapping, or an XComArg resolved when the task renders (a cutover's green_conf)
        self.sparkpoint_conf: Any = sparkpoint_conf if isinstance(sparkpoint_conf, XComArg) \
            else dict(sparkpoint_conf or {})
        self.ship_runtime = ship_runtime
        self.stop_timeout = durations.seconds("stop_timeout", stop_timeout, allow_zero=True)
        self.spark_history_server = spark_history_server
        self.state_partitions = state_partitions
        self.takeover = takeover
        self.deferrable = default_deferrable(deferrable)
        self.poll_interval = durations.seconds("poll_interval", poll_interval)
        self.dead_after = durations.seconds("dead_after", dead_after)
        #: ``kubernetes`` or ``yarn`` in cluster mode, None in client mode (set by `check_spark`)
        self.cluster_kind: str | None = None
        self._try_state = TryState()  # what this try's deploy mode started (`on_kill` ends it)
        #: the run this try started (its generation claim), once the driver recorded it
        self.sparkpoint_run: dict[str, Any] | None = None
        #: the run result of this try (OpenLineage facets), once it ended
        self.sparkpoint_result: dict[str, Any] | None = None
        # (user's conf, what execute set)
        self._conf_given: tuple[dict[str, Any], dict[str, Any]] | None = None

    def declared_output(self) -> Sink | None:
        """The job's declared sink (`sink`, else the connection's ``jobs.<job>.sink``), or
        None (logged when a declaration is unusable)."""
        return self._asset_events.declared_output(self.sink)

    # ------------------------------------------------------------------ helpers

    def _catalog(self) -> Catalog:
        return self.sparkpoint_hook.get_catalog(self.job_name)

    def _submit_settings(self) -> SubmitSettings:
        """The job's submit settings as rendered on this operator (`services.submit_try`)."""
        hook = self.sparkpoint_hook
        return SubmitSettings(
            job=self.job_name, task=self.task_id, storage_uri=hook.storage_uri,
            storage_options=hook.storage_options, restore=self.restore,
            restore_snapshot=self.restore_snapshot, trigger=self.trigger,
            checkpoint_interval=self.checkpoint_interval, num_retained=self.num_retained,
            commit_mode=self.commit_mode, work_dir=self.work_dir, state_partitions=self.state_partitions,
            takeover=self.takeover, spark_conf=dict(self.conf or {}), extra=self.sparkpoint_conf)

    def choose_restore(self, try_number: int, catalog: Catalog | None = None,
                       own_generations: Sequence[int] | None = None) -> str:
        """What try `try_number` restores (`services.submit_try.SubmitSettings.choose_restore`:
        `restore` on the first try, then the latest retained checkpoint of the task's own
        tries; `restore_snapshot` on every try).

        :raises ConfigError: `restore_snapshot` is not a path.
        """
        return self._submit_settings().choose_restore(try_number, catalog, own_generations)

    def build_sparkpoint_conf(self, restore: str) -> dict[str, str]:
        """The ``spark.sparkpoint.*`` settings for this submit
        (`services.submit_try.SubmitSettings.conf`).

        :raises ConfigError: a setting is invalid (before anything is submitted).
        """
        return self._submit_settings().conf(restore)

    def _get_hook(self) -> SparkpointSubmitHook:
        return SparkpointSubmitHook.of(super()._get_hook(), self._try_state.secret_env)

    def _build_hook(self) -> SparkpointSubmitHook:
        """The Spark provider's hook built anew (with the final conf, environment and files
        and this try's secret environment) and kept as its ``_hook``, which the provider's
        ``on_kill`` ends: for a spark-submit the deploy mode runs itself, not through the
        provider's execute (a detached launch, a cluster-mode submit)."""
        hook = self._get_hook()  # (execute cleared the last try's)
        self._hook = hook
        return hook

    # ------------------------------------------------------------------ execute

    def execute(self, context: Context) -> dict[str, Any] | None:  # type: ignore[override]
        try_number = int(getattr(context["ti"], "try_number", 1) or 1)
        store = context.get("task_state_store")  # Airflow 3.3+
        # A new try: nothing it starts is an earlier try's. The Spark provider's hook is
        # built again with this try's final settings (by its execute, or `_build_hook`).
        self._try_state = self._try_state.next_try()
        self._hook = None
        if self._conf_given is not None and self.conf == self._conf_given[1]:
            # an earlier execute of this object set it: the user's again
            self.conf = dict(self._conf_given[0])
        try:  # bad input fails before anything is recorded or submitted, and is not retried
            check_spark(self)
            catalog = self._catalog()
            prepared = self._submit_settings().prepare(catalog, store, try_number, logger=self.log)
        except SparkpointConfigFailure:
            raise
        except (ConfigError, AirflowNotFoundException) as exc:  # the latter: a missing sparkpoint connection
            raise SparkpointConfigFailure(str(exc)) from exc
        starter = task_try(context, self.dag_id, self.task_id)
        if self.deferrable:  # a resumption follows its own live run again (defers, never returns then)
            prepared = submit_deferred.resume(self, context, catalog, starter, prepared)
        # Refused here, before spark-submit; the driver checks again (the same rule) before its claim.
        token = prepared.start(catalog, starter, store=store, retention=never_expire())
        since = prepared.since
        self.conf = prepared.spark_conf
        self._conf_given = (dict(prepared.submit.spark_conf), dict(self.conf))
        if self.cluster_kind is not None:  # the driver runs on the cluster: never the parent's execute
            return submit_cluster.run(self, self._try_state, context, catalog, token=token, since=since,
                                      starter=starter)
        return submit_client.run(self, self._try_state, context, catalog, token=token, since=since,
                                 starter=starter, spark_submit=super().execute)

    def execute_complete(self, context: Context, event: Any = None, *, generation: int, token: str = "",
                         since: int = 0) -> dict[str, Any] | None:
        """The deferred run ended (`submit_deferred.complete`: as `execute` ends, or its error)."""
        return submit_deferred.complete(self, context, event, generation=generation, token=token, since=since)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the output dataset (the declared sink) and the ``sparkpoint`` run facet."""
        return lineage.submit_lineage(self)

    def on_kill(self) -> None:
        """End the driver through signals, never through a control request.

        The task supervisor has already sent SIGTERM to the task's process group (the
        driver records its failed status and stops taking on work) and sends SIGKILL 5 s
        later; a stop-with-savepoint cannot finish in that time, and a stop request would
        outlive the driver and stop a later run. So: SIGTERM spark-submit and its
        children (again, for an execution timeout, where no supervisor signal came),
        give them `stop_timeout` seconds, then the Spark hook's own kill (SIGKILL)
        (`submit_client.stop`; a driver launched detached before the task deferred: its
        process group).

        Cluster mode differs (`submit_cluster.stop`): no signal reaches a driver on the
        cluster, so a control cancel addressed to the run's generation (it cannot stop a
        later run), `stop_timeout` seconds for its end, then the cluster manager's kill.
        """
        state = self._try_state
        if not submit_cluster.stop(self, state):  # no driver on a cluster: signals to spark-submit here
            submit_client.stop(self, state, spark_kill=super().on_kill)

