"""`SparkpointSubmitOperator`: spark-submit a checkpointed PySpark job.

A `SparkSubmitOperator` (its parameters keep working) that wires the Sparkpoint
runtime: sets the ``spark.sparkpoint.*`` conf, chooses the restore target (``restore``
on the first try, the latest retained checkpoint of the task's own runs on every retry),
optionally ships the runtime with ``--py-files``, and returns the run result as XCom.

Client deploy mode only: the driver runs under the task, so a kill of the task reaches
it (see `on_kill` and `airflow_sparkpoint.runtime.signals`). ``deploy_mode="cluster"``
is refused before anything is submitted (see `refuse_cluster_mode`).

Each submit carries a token (environment ``SPARKPOINT_SUBMITTER``) that the driver
records with its generation claim: the operator finds its own run, result and
application id by it, never by "the newest generation", which another run may hold.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from airflow_sparkpoint import durations
from airflow_sparkpoint.checkpoints import Catalog, GenerationInfo, open_snapshot
from airflow_sparkpoint.exceptions import ConfigError, RestoreError, SparkpointError
from airflow_sparkpoint.operators import lineage, runs
from airflow_sparkpoint.operators.asset_events import SparkpointAssetsMixin
from airflow_sparkpoint.operators.driver_errors import DriverError, SparkpointRunFailed, failure
from airflow_sparkpoint.operators.health import emit_metrics_for
from airflow_sparkpoint.operators.job_mixin import SparkpointJobMixin
from airflow_sparkpoint.operators.links import (
    SparkpointCheckpointHistoryLink,
    SparkpointSparkUILink,
    checkpoint_history_url,
    spark_ui_url,
)
from airflow_sparkpoint.operators.submit_checks import (
    SparkpointConfigFailure,
    path_with_local_spark,
    require_spark_binary,
    require_spark_connection,
    resolve_application,
    sparkpoint_settings,
)
from airflow_sparkpoint.operators.submit_dir import (
    ROCKSDB_LIBRARY_DIR_ENV,
    build_runtime_zip,
    open_submit_dir,
)
from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook
from airflow_sparkpoint.runtime.config import PREFIX, SUBMITTER_ENV, SparkpointConfig
from airflow_sparkpoint.runtime.takeover import check_start
from airflow_sparkpoint.sinks.resolve import SinkSpec, declared_sink
from airflow_sparkpoint.storage.endpoints import ENDPOINT_URL, REGION_NAME

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Private names of the Spark provider this operator relies on (present in 6.0 through 6.3;
#: pyproject.toml bounds the provider below 7, and a test checks them on the installed one):
#: (class, attribute); ``_connection`` keys are checked as well.
SPARK_PROVIDER_PRIVATE_NAMES = (
    (SparkSubmitOperator, "_get_hook"), (SparkSubmitOperator, "_hook"), (SparkSubmitOperator, "_conn_id"),
    (SparkSubmitHook, "_connection"), (SparkSubmitHook, "_env"), (SparkSubmitHook, "_submit_sp"),
    (SparkSubmitHook, "_build_spark_submit_command"), (SparkSubmitHook, "_process_spark_submit_log"),
)
SPARK_CONNECTION_KEYS = ("master", "deploy_mode")

def local_spark_home() -> str | None:
    """The Spark distribution that this interpreter's PySpark carries (pip's ``pyspark``
    has ``bin/spark-submit`` and the jars), or None: no pyspark, or only the Spark
    provider's ``pyspark-client`` (the Spark Connect client: a ``pyspark`` package with
    neither), which can run no driver and is no ``SPARK_HOME``."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__ or "/nonexistent").parent  # None for a namespace package
    return str(home) if (home / "bin" / "spark-submit").is_file() else None


def chosen_snapshot(value: Any) -> str | None:
    """`restore_snapshot` as a path, or None when not set (None or blank).

    :raises ConfigError: ``latest``/``none`` or not a string (those are `restore` values).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or value.strip().lower() in ("latest", "none"):
        raise ConfigError(f"restore_snapshot={value!r} is invalid; expected a savepoint or checkpoint path (see "
                          "`sparkpoint list`), or empty; 'latest' and 'none' are values of restore=")
    return value.strip()


def _interval_text(value: Any, *, rendered: bool = False) -> str:
    """`checkpoint_interval` as the conf string the job reads: a timedelta or a number
    becomes seconds (``30s``); a string is checked and kept (a template is checked once
    `rendered`).

    :raises ConfigError: not a duration >= 0 (the message names the parameter and value).
    """
    if isinstance(value, str):
        if rendered or "{{" not in value and "{%" not in value:
            durations.seconds("checkpoint_interval", value, allow_zero=True)
        return value
    return durations.conf_text(durations.seconds("checkpoint_interval", value, allow_zero=True))


class SparkpointSubmitOperator(SparkpointJobMixin, SparkpointAssetsMixin, SparkSubmitOperator):
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
        seconds, a timedelta or a string such as ``"3s"``).
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

    Returns (XCom) the run result; with key ``generation`` the generation the try ran
    (pushed also when it failed) and with key ``spark_application`` its claim (application
    id, UI URL, host, pid).

    :raises ConfigError: bad settings or ``deploy_mode="cluster"``, before anything runs.
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
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"sparkpoint-{job_name}")
        super().__init__(**kwargs)
        self._init_job(job_name, checkpoint_dir, sparkpoint_conn_id)
        declared_sink(sink)  # a malformed declaration fails when the DAG is parsed
        self.sink = sink
        self._init_assets(emit_asset_events)
        if commit_mode not in ("checkpoint", "external"):
            raise ConfigError(f"commit_mode={commit_mode!r} is not allowed; expected 'checkpoint' or 'external'")
        if not isinstance(num_retained, int) or num_retained < 1:
            raise ConfigError(f"num_retained={num_retained!r} is not allowed; expected an integer >= 1")
        if state_partitions is not None and (
                isinstance(state_partitions, bool) or not isinstance(state_partitions, int) or state_partitions < 1):
            raise ConfigError(f"state_partitions={state_partitions!r} is invalid; expected an integer >= 1 "
                              "(or None: the snapshot's own number)")
        self.restore = restore
        self.restore_snapshot = restore_snapshot
        self.trigger = trigger
        self.checkpoint_interval = _interval_text(checkpoint_interval)
        self.num_retained = num_retained
        self.commit_mode = commit_mode
        self.work_dir = work_dir
        self.sparkpoint_conf = dict(sparkpoint_conf or {})
        self.ship_runtime = ship_runtime
        self.stop_timeout = durations.seconds("stop_timeout", stop_timeout, allow_zero=True)
        self.spark_history_server = spark_history_server
        self.state_partitions = state_partitions
        if not isinstance(takeover, bool):
            raise ConfigError(f"takeover={takeover!r} is invalid; expected True or False")
        self.takeover = takeover
        #: the run this try started (its generation claim), once the driver recorded it
        self.sparkpoint_run: dict[str, Any] | None = None
        #: the run result of this try (OpenLineage facets), once it ended
        self.sparkpoint_result: dict[str, Any] | None = None
        self._secret_env: dict[str, str] = {}
        self._native_dir: str | None = None  # the ROCKSDB_SHAREDLIB_DIR this object set, if any
        self._conf_given: tuple[dict[str, Any], dict[str, Any]] | None = None  # (user's conf, what execute set)

    # ------------------------------------------------------------------ helpers

    def _catalog(self) -> Catalog:
        return self.sparkpoint_hook.get_catalog(self.job_name)

    def choose_restore(self, try_number: int, catalog: Catalog | None = None,
                       own_generations: Sequence[int] | None = None) -> str:
        """``restore`` on the first try; on a retry, the latest retained checkpoint of the
        task's own tries (resume, never restart).

        `restore_snapshot`, when set, on every try (a hand-chosen restore).

        ``restore="latest"``/``"none"``: a retry restores ``latest``. A savepoint or
        checkpoint path: a retry restores the newest checkpoint that one of the task's
        tries completed (``latest`` when that is the job's newest, else its path), or the
        same path again while none did — never another run's state. `own_generations`
        (from the task state record, Airflow 3.3+) are the generations the task's tries
        ran; without them, a checkpoint newer than the path counts as the task's own.
        """
        chosen = chosen_snapshot(self.restore_snapshot)
        if chosen is not None:
            return chosen
        if try_number <= 1:
            return self.restore
        if self.restore in ("latest", "none") or catalog is None:
            return "latest"
        latest = catalog.latest()
        if latest is None:
            return self.restore
        if own_generations is not None:
            own = [meta for meta in catalog.checkpoints() if meta.generation in set(own_generations)]
            if not own:
                return self.restore
            newest = max(own, key=lambda meta: meta.id)
            return "latest" if newest.id == latest.id else catalog.checkpoint_uri(newest.id)
        try:
            target = open_snapshot(self.restore, storage_options=self.sparkpoint_hook.storage_options).metadata
        except RestoreError:
            return "latest"
        return self.restore if latest.created_at <= target.created_at else "latest"

    def build_sparkpoint_conf(self, restore: str) -> dict[str, str]:
        """The ``spark.sparkpoint.*`` settings for this submit, validated like the job does.

        :raises ConfigError: a setting is invalid (before anything is submitted).
        """
        options = self.sparkpoint_hook.storage_options
        conf: dict[str, str] = {
            f"{PREFIX}dir": self.sparkpoint_hook.storage_uri,
            f"{PREFIX}job": self.job_name,
            f"{PREFIX}restore": restore,
            f"{PREFIX}trigger": self.trigger,
            f"{PREFIX}checkpoint.interval": _interval_text(self.checkpoint_interval, rendered=True),
            f"{PREFIX}checkpoint.numRetained": str(self.num_retained),
            f"{PREFIX}commit.mode": self.commit_mode,
        }
        if self.work_dir:
            conf[f"{PREFIX}workDir"] = self.work_dir
        if options.get(ENDPOINT_URL):
            conf[f"{PREFIX}s3.endpoint"] = str(options[ENDPOINT_URL])
        if options.get(REGION_NAME):
            conf[f"{PREFIX}s3.region"] = str(options[REGION_NAME])
        if self.state_partitions is not None:
            conf[f"{PREFIX}restore.statePartitions"] = str(self.state_partitions)
        if self.takeover:
            conf[f"{PREFIX}takeover"] = "true"
        # spark.sparkpoint.* keys in conf too: validated here, not by the driver 20 s later
        conf.update(sparkpoint_settings(self.conf, self.sparkpoint_conf))
        parsed = SparkpointConfig.from_conf(conf)
        shuffle = (self.conf or {}).get("spark.sql.shuffle.partitions")
        if parsed.restore_state_partitions is not None and shuffle is not None and \
                str(shuffle).strip() != str(parsed.restore_state_partitions):
            # The job would refuse it too (after the submit): state partitions are shuffle partitions.
            raise ConfigError(f"spark.sql.shuffle.partitions={shuffle} contradicts state_partitions="
                              f"{parsed.restore_state_partitions}; remove it or set it to the same number")
        return conf

    def _secret_environment(self) -> dict[str, str]:
        options = self.sparkpoint_hook.storage_options
        env = {}
        for option, variable in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                                 ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                                 ("aws_session_token", "AWS_SESSION_TOKEN")):
            if options.get(option):
                env[variable] = str(options[option])
        return env

    def spark_environment(self, master: str, *, native_dir: str | None = None) -> dict[str, str]:
        """spark-submit's environment additions: this interpreter's Spark when no Spark
        install is configured, the Python interpreters, and `native_dir` as the driver's
        RocksDB library directory unless one is set (`airflow_sparkpoint.operators.submit_dir`).

        The driver runs here (client mode): ``PYSPARK_DRIVER_PYTHON`` defaults to this
        interpreter when it has a PySpark with its Spark distribution (`local_spark_home`);
        an Airflow worker without one (no pyspark, or the Spark provider's pyspark-client)
        leaves it to Spark, which then runs the driver with ``PYSPARK_PYTHON``. Spark's
        Python workers run ``spark.pyspark.python`` (conf) or ``PYSPARK_PYTHON``
        (`env_vars` or this worker's environment) when given; else the `sparkpoint`
        connection's ``pyspark_python``; else this interpreter for a ``local[...]`` master
        (same machine) when it has that PySpark, and ``python3`` (Spark's own default)
        otherwise, as on a cluster, where this worker's interpreter path means nothing.
        """
        env: dict[str, str] = {}
        current = {**os.environ, **(self.env_vars or {})}
        if native_dir and not current.get(ROCKSDB_LIBRARY_DIR_ENV):
            env[ROCKSDB_LIBRARY_DIR_ENV] = native_dir
        spark_here = local_spark_home()
        if not current.get("SPARK_HOME") and spark_here:
            env["SPARK_HOME"] = spark_here
        path = path_with_local_spark(current)
        if path is not None:
            env["PATH"] = path
        if not current.get("PYSPARK_DRIVER_PYTHON") and not (self.conf or {}).get("spark.pyspark.driver.python"):
            if spark_here:
                env["PYSPARK_DRIVER_PYTHON"] = sys.executable
            else:
                self.log.info("this worker's Python %s has no PySpark to run the driver: Spark runs it with "
                              "spark.pyspark.python / PYSPARK_PYTHON", sys.executable)
        if (self.conf or {}).get("spark.pyspark.python") or current.get("PYSPARK_PYTHON"):
            return env
        local = master.strip().lower().startswith("local") and spark_here is not None
        from_conn = self.sparkpoint_hook.pyspark_python if self.sparkpoint_conn_id else None
        env["PYSPARK_PYTHON"] = from_conn or (sys.executable if local else "python3")
        self.log.info("Spark's Python workers run %s (%s)", env["PYSPARK_PYTHON"],
                      f"connection {self.sparkpoint_conn_id!r}" if from_conn
                      else "this interpreter: local master" if local else "Spark's default; set "
                      "spark.pyspark.python, PYSPARK_PYTHON or the connection's Python field for your cluster")
        return env

    def _get_hook(self) -> SparkpointSubmitHook:
        return SparkpointSubmitHook.of(super()._get_hook(), self._secret_env)

    def refuse_cluster_mode(self, hook: SparkSubmitHook) -> None:
        """Refuse ``deploy_mode="cluster"`` (operator, Spark connection or conf).

        In cluster mode the driver runs on the cluster: a kill of this task would not
        reach it, and the Spark provider's durable reconnect would make a retry attach
        to a still running application and return no result. Until both are handled
        through the cluster manager (and tested against one), only client mode runs.

        :raises ConfigError: cluster mode was asked for.
        """
        mode = str(hook._connection.get("deploy_mode") or (self.conf or {}).get("spark.submit.deployMode") or "")
        if mode.strip().lower() == "cluster":
            raise ConfigError(
                f"SparkpointSubmitOperator {self.task_id!r}: deploy_mode='cluster' is not supported (from the "
                f"operator, the {self._conn_id!r} connection's deploy-mode or spark.submit.deployMode); expected "
                "client mode, where the driver runs under this task so that a kill or a retry reaches it"
            )

    # ------------------------------------------------------------------ execute

    def check_spark(self) -> SparkSubmitHook:
        """The Spark provider's hook, once its connection, deploy mode and ``spark-submit``
        are known to be usable; the relative `application` resolved (`submit_checks`).

        :raises ConfigError: naming what is missing or refused.
        """
        require_spark_connection(self._conn_id)  # else the provider falls back to master yarn
        hook = self._get_hook()
        self.refuse_cluster_mode(hook)
        path = path_with_local_spark({**os.environ, **(self.env_vars or {})})
        require_spark_binary(str(hook._connection.get("spark_binary") or "spark-submit"),
                             path or {**os.environ, **(self.env_vars or {})}.get("PATH", os.defpath))
        self.application = resolve_application(self.application, self.dag.fileloc if self.has_dag() else None)
        return hook

    def execute(self, context: Context) -> dict[str, Any] | None:  # type: ignore[override]
        ti = context["ti"]
        try_number = int(getattr(ti, "try_number", 1) or 1)
        store = context.get("task_state_store")  # Airflow 3.3+
        if self._conf_given is not None and self.conf == self._conf_given[1]:
            self.conf = dict(self._conf_given[0])  # an earlier execute of this object set it: the user's again
        try:  # bad input fails before anything is recorded or submitted, and is not retried
            self.check_spark()
            catalog = self._catalog()
            previous = runs.TaskRecord.load(store) if try_number > 1 else None
            generation_before = catalog.current_generation()
            own = previous.generations(catalog) if previous is not None else None
            restore = self.choose_restore(try_number, catalog, own)
            self._log_decision(catalog, try_number, restore, previous)
            sparkpoint_conf = self.build_sparkpoint_conf(restore)
        except SparkpointConfigFailure:
            raise
        except (ConfigError, AirflowNotFoundException) as exc:  # the latter: a missing sparkpoint connection
            raise SparkpointConfigFailure(str(exc)) from exc
        starter = runs.task_try(context, self.dag_id, self.task_id)
        # Refused here, before spark-submit; the driver checks again (the same rule) before its claim.
        check_start(catalog, starter, takeover=self.takeover)
        token = runs.new_token()
        runs.TaskRecord(try_number, restore, (*(previous.tokens if previous else ()), token),
                        previous.since if previous else generation_before).save(store)
        given = dict(self.conf or {})
        self.conf = {**given, **sparkpoint_conf}
        self._conf_given = (given, dict(self.conf))
        self._secret_env = {**self._secret_environment(), **runs.starter_environment(starter), SUBMITTER_ENV: token}
        master = str(self._get_hook()._connection.get("master") or "")
        submit_dir = open_submit_dir()  # removed when spark-submit has ended (else by a later sweep)
        try:
            # An earlier execute of this object set its own (now removed) directory: not the user's.
            self.env_vars = {k: v for k, v in (self.env_vars or {}).items()
                             if not (k == ROCKSDB_LIBRARY_DIR_ENV and v == self._native_dir)}
            self._native_dir = submit_dir.native_dir
            self.env_vars = {**self.spark_environment(master, native_dir=submit_dir.native_dir), **self.env_vars}
            if self.ship_runtime:
                self.py_files = ",".join(p for p in (self.py_files, build_runtime_zip(submit_dir.path)) if p)
            self._hook = None  # rebuilt with the final environment and files
            self._push(ti, SparkpointCheckpointHistoryLink().xcom_key,
                       checkpoint_history_url(self.job_name, self.sparkpoint_conn_id, self.checkpoint_dir))
            watcher = runs.RunWatcher(catalog, token, generation_before, lambda run: self._found(ti, run))
            watcher.start()
        except BaseException:
            submit_dir.close()
            raise
        try:
            super().execute(context)
        except AirflowException as exc:
            # The hook's message is only the command and its exit code: the run's own error first.
            reported = self._run_failure(catalog, token, generation_before)
            if reported is None:
                raise
            raise reported from exc
        finally:
            watcher.stop()
            try:
                self._found(ti, runs.find_claim(catalog, token, after=generation_before))
            except SparkpointError as exc:  # keep the run's own error, if any
                self.log.warning("could not read the generation claims of job %s: %s", self.job_name, exc)
            process = getattr(self._hook, "_submit_sp", None)
            if process is not None and process.stdout is not None:
                process.stdout.close()  # the Spark hook leaves its log pipe open
            submit_dir.close()
        if self.sparkpoint_run is None:
            self.log.warning("job %s ended without claiming a generation (did it call job.run()?)", self.job_name)
            return None
        generation = int(self.sparkpoint_run["generation"])
        result = runs.read_result(catalog, generation)
        emit_metrics_for(catalog, every=0)  # checkpoint metrics through Airflow's Stats (never raises)
        if result is None:
            self.log.warning("job %s generation %d ended without a Sparkpoint run result", self.job_name, generation)
            return None
        self.log.info("job %s generation %s %s: last batch %s, last checkpoint %s, savepoint %s",
                      self.job_name, result.get("generation"), result.get("status"), result.get("last_batch"),
                      result.get("last_checkpoint"), result.get("savepoint"))
        self.sparkpoint_result = result
        committed = [*(result.get("recovered") or {}).get("committed", ()), *result.get("committed_batches", ())]
        self._emit_output(context, catalog, self.declared_output(), generation=generation, batches=committed,
                          source="submit")
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the output dataset (the declared sink) and the ``sparkpoint`` run facet."""
        return lineage.submit_lineage(self)

    def _run_failure(self, catalog: Catalog, token: str, after: int) -> AirflowException | None:
        """The task's exception for the failed run of submit `token`: its driver's error
        line; else the error its status record holds; else its output's last Python
        traceback (`driver_errors`); None when none says anything. A driver's
        `ConfigError` is not retried (`SparkpointConfigFailure`)."""
        hook = self._hook if isinstance(self._hook, SparkpointSubmitHook) else None
        output = hook.driver_output if hook is not None else None
        recorded = runs.reported_error(catalog, token, after=after)
        error = (output.reported if output else None) or (DriverError("", recorded) if recorded else None) or (
            output.traceback if output else None)
        if error is None:
            return None
        error = DriverError(error.type, self.sparkpoint_hook.scrub(error.message))
        process = getattr(hook, "_submit_sp", None)
        message = failure(self.job_name, error, exit_code=getattr(process, "returncode", None))
        return SparkpointConfigFailure(message) if error.type == "ConfigError" else SparkpointRunFailed(message, error)

    def _log_decision(self, catalog: Catalog, try_number: int, restore: str, previous: runs.TaskRecord | None) -> None:
        if chosen_snapshot(self.restore_snapshot) is not None:
            self.log.info("try %d: job %s restores %s (restore_snapshot: a hand-chosen restore, honoured on every "
                          "try)", try_number, self.job_name, restore)
            return
        if try_number <= 1:
            self.log.info("first try: job %s starts with restore=%s", self.job_name, restore)
            return
        if previous is not None:
            run = runs.find_claim(catalog, previous.tokens[-1], after=previous.since)
            status = runs.run_status(catalog, run.generation) if run is not None else None
            if run is None:
                self.log.info("try %d: the previous try (%d) started no run of job %s", try_number,
                              previous.try_number, self.job_name)
            elif status is not None:
                self.log.info("try %d: the previous try (%d) ran generation %d, which ended %s%s", try_number,
                              previous.try_number, run.generation, status.state,
                              f" ({status.error})" if status.error else "")
        if restore == "latest":
            self.log.info("try %d of %s: resuming job %s from its latest retained checkpoint (restore=latest; "
                          "the first try's restore=%r is not used again)", try_number, self.task_id, self.job_name,
                          self.restore)
        elif restore == self.restore:
            self.log.info("try %d of %s: no try of this task completed a checkpoint of job %s yet; restoring %s "
                          "again", try_number, self.task_id, self.job_name, restore)
        else:
            self.log.info("try %d of %s: resuming job %s from %s, the newest checkpoint of this task's own tries "
                          "(a newer one is another run's)", try_number, self.task_id, self.job_name, restore)

    def _found(self, ti: Any, run: GenerationInfo | None) -> None:
        """Record the run this try started (once) and publish its generation and links."""
        with _FOUND_LOCK:
            if run is None or self.sparkpoint_run is not None:
                return
            self.sparkpoint_run = runs.claim_json(run)
        self.log.info("job %s runs as generation %d (application %s, UI %s)", self.job_name, run.generation,
                      run.app or "?", run.ui or "off")
        self._push(ti, "generation", run.generation)
        self._push(ti, "spark_application", self.sparkpoint_run)
        self._push(ti, SparkpointSparkUILink().xcom_key, spark_ui_url(self.sparkpoint_run, self.spark_history_server))

    def _push(self, ti: Any, key: str, value: Any) -> None:
        if value in (None, ""):
            return
        try:
            ti.xcom_push(key=key, value=value)
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            self.log.debug("could not push XCom %r: %s", key, exc)

    def on_kill(self) -> None:
        """End the driver through signals, never through a control request.

        The task supervisor has already sent SIGTERM to the task's process group (the
        driver records its failed status and stops taking on work) and sends SIGKILL 5 s
        later; a stop-with-savepoint cannot finish in that time, and a stop request would
        outlive the driver and stop a later run. So: SIGTERM spark-submit and its
        children (again, for an execution timeout, where no supervisor signal came),
        give them `stop_timeout` seconds, then the Spark hook's own kill (SIGKILL).
        """
        process = getattr(self._hook, "_submit_sp", None)
        if process is not None and process.poll() is None:
            runs.signal_tree(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if process.poll() is not None:
                self.log.info("spark-submit of job %s ended after SIGTERM (exit %s)", self.job_name,
                              process.returncode)
        if self._hook is not None:
            super().on_kill()


#: serializes `SparkpointSubmitOperator._found` (the watcher thread and the task's own);
#: module-level: a lock on the operator would not survive its deep copies
_FOUND_LOCK = threading.Lock()
