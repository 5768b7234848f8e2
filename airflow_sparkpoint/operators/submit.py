"""`SparkpointSubmitOperator`: spark-submit a checkpointed PySpark job.

A `SparkSubmitOperator` (all of its parameters keep working) that wires the Sparkpoint
runtime: sets the ``spark.sparkpoint.*`` conf, chooses the restore target (``restore``
on the first try, the latest retained checkpoint on every retry), optionally ships the
runtime with ``--py-files``, and returns the run result as XCom.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_sparkpoint.checkpoints import Catalog, open_snapshot
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.status import result_key
from airflow_sparkpoint.exceptions import ConfigError, ObjectNotFound, RestoreError
from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
from airflow_sparkpoint.operators.health import emit_metrics_for
from airflow_sparkpoint.runtime.config import PREFIX, SparkpointConfig

if TYPE_CHECKING:
    from airflow.sdk import Context

# Modules a Spark cluster needs; the Airflow layer stays behind.
_RUNTIME_PACKAGES = ("checkpoints", "runtime", "sinks", "storage")
_RUNTIME_MODULES = ("__init__.py", "exceptions.py", "faults.py", "py.typed")


def build_runtime_zip() -> str:
    """Zip the Spark-side runtime (storage, checkpoints, runtime, sinks) for ``--py-files``.

    The archive imports with no Airflow and no install of the provider; the caller
    deletes the returned temporary file.
    """
    package = Path(__file__).resolve().parent.parent
    handle, path = tempfile.mkstemp(prefix="sparkpoint-runtime-", suffix=".zip")
    os.close(handle)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in _RUNTIME_MODULES:
            if (package / name).exists():
                archive.write(package / name, f"airflow_sparkpoint/{name}")
        for sub in _RUNTIME_PACKAGES:
            for file in sorted((package / sub).rglob("*.py")):
                archive.write(file, f"airflow_sparkpoint/{file.relative_to(package).as_posix()}")
    return path


class _SecretEnvSparkSubmitHook(SparkSubmitHook):
    """A SparkSubmitHook that passes credentials to spark-submit's environment only:
    never on the command line (which is logged) and never in templated fields."""

    def __init__(self, *args: Any, secret_env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._secret_env = dict(secret_env or {})

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command = super()._build_spark_submit_command(application)
        if self._secret_env:
            self._env = {**(self._env or {}), **self._secret_env}
        return command


class SparkpointSubmitOperator(SparkSubmitOperator):
    """Submit a Sparkpoint PySpark job and return its run result.

    :param job_name: pipeline name (``spark.sparkpoint.job``): the identity of its state
        and of its sink transactions.
    :param checkpoint_dir: storage root (``spark.sparkpoint.dir``); or use `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection giving the storage root and S3
        endpoint/credentials (credentials reach spark-submit through its environment).
    :param restore: ``latest``, ``none`` or a savepoint/checkpoint path for the first try
        (templated: a savepoint path can come from XCom). Retries always restore ``latest``.
    :param trigger: ``availableNow`` or ``processingTime:<interval>``.
    :param checkpoint_interval: ``spark.sparkpoint.checkpoint.interval`` (e.g. ``"0"``, ``"30s"``).
    :param num_retained: completed checkpoints to keep.
    :param commit_mode: ``checkpoint`` or ``external``.
    :param work_dir: ``spark.sparkpoint.workDir`` (Spark's live checkpoint location).
    :param sparkpoint_conf: further ``spark.sparkpoint.*`` settings (without or with prefix).
    :param ship_runtime: zip the pure-Python runtime and add it with ``--py-files``, so a
        cluster needs no install of the provider.
    :param stop_timeout: seconds `on_kill` waits for a clean stop before killing.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "job_name",
        "checkpoint_dir",
        "restore",
        "trigger",
        "checkpoint_interval",
        "work_dir",
        "sparkpoint_conf",
    )

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        restore: str = "latest",
        trigger: str = "availableNow",
        checkpoint_interval: str | float = "0",
        num_retained: int = 3,
        commit_mode: str = "checkpoint",
        work_dir: str | None = None,
        sparkpoint_conf: Mapping[str, Any] | None = None,
        ship_runtime: bool = False,
        stop_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"sparkpoint-{job_name}")
        super().__init__(**kwargs)
        if not checkpoint_dir and not sparkpoint_conn_id:
            raise ConfigError("SparkpointSubmitOperator needs checkpoint_dir or sparkpoint_conn_id (the storage root)")
        if commit_mode not in ("checkpoint", "external"):
            raise ConfigError(f"commit_mode={commit_mode!r} is not allowed; expected 'checkpoint' or 'external'")
        if not isinstance(num_retained, int) or num_retained < 1:
            raise ConfigError(f"num_retained={num_retained!r} is not allowed; expected an integer >= 1")
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = sparkpoint_conn_id
        self.restore = restore
        self.trigger = trigger
        self.checkpoint_interval = str(checkpoint_interval)
        self.num_retained = num_retained
        self.commit_mode = commit_mode
        self.work_dir = work_dir
        self.sparkpoint_conf = dict(sparkpoint_conf or {})
        self.ship_runtime = ship_runtime
        self.stop_timeout = stop_timeout
        self._sp_hook: SparkpointHook | None = None
        self._secret_env: dict[str, str] = {}
        self._shipped_zip: str | None = None

    # ------------------------------------------------------------------ helpers

    @property
    def sparkpoint_hook(self) -> SparkpointHook:
        if self._sp_hook is None:
            self._sp_hook = SparkpointHook(self.sparkpoint_conn_id, storage_uri=self.checkpoint_dir)
        return self._sp_hook

    def _catalog(self) -> Catalog:
        return self.sparkpoint_hook.get_catalog(self.job_name)

    def choose_restore(self, try_number: int, catalog: Catalog | None = None) -> str:
        """``restore`` on the first try; on a retry, the latest retained checkpoint (resume,
        never restart).

        One exception keeps a retry from picking state that is not this task's: when the
        first try restored a savepoint/checkpoint path and no checkpoint newer than that
        snapshot exists (the first try died before its first checkpoint), the retry
        restores the same path again instead of an unrelated older checkpoint.
        """
        if try_number <= 1:
            return self.restore
        if self.restore in ("latest", "none") or catalog is None:
            return "latest"
        latest = catalog.latest()
        try:
            target = open_snapshot(self.restore, storage_options=self.sparkpoint_hook.storage_options).metadata
        except RestoreError:
            return "latest"
        if latest is None or latest.created_at <= target.created_at:
            return self.restore
        return "latest"

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
            f"{PREFIX}checkpoint.interval": self.checkpoint_interval,
            f"{PREFIX}checkpoint.numRetained": str(self.num_retained),
            f"{PREFIX}commit.mode": self.commit_mode,
        }
        if self.work_dir:
            conf[f"{PREFIX}workDir"] = self.work_dir
        if options.get("endpoint_url"):
            conf[f"{PREFIX}s3.endpoint"] = str(options["endpoint_url"])
        if options.get("region_name"):
            conf[f"{PREFIX}s3.region"] = str(options["region_name"])
        for key, value in self.sparkpoint_conf.items():
            full = key if key.startswith(PREFIX) else PREFIX + key
            conf[full] = str(value)
        SparkpointConfig.from_conf(conf)
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

    def _local_spark_environment(self) -> dict[str, str]:
        """Point spark-submit at this interpreter's PySpark when no Spark install is configured."""
        env: dict[str, str] = {}
        current = {**os.environ, **(self.env_vars or {})}
        if not current.get("SPARK_HOME"):
            try:
                import pyspark

                env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
            except ImportError:
                pass
        bindir = str(Path(sys.executable).parent)
        if shutil.which("spark-submit", path=current.get("PATH")) is None and os.path.exists(
            os.path.join(bindir, "spark-submit")
        ):
            env["PATH"] = bindir + os.pathsep + current.get("PATH", os.defpath)
        if not current.get("PYSPARK_PYTHON"):
            env["PYSPARK_PYTHON"] = sys.executable
        return env

    def _get_hook(self) -> SparkSubmitHook:
        base = super()._get_hook()
        hook = _SecretEnvSparkSubmitHook.__new__(_SecretEnvSparkSubmitHook)
        hook.__dict__.update(base.__dict__)
        hook._secret_env = dict(self._secret_env)
        return hook

    # ------------------------------------------------------------------ execute

    def execute(self, context: Context) -> dict[str, Any] | None:  # type: ignore[override]
        ti = context["ti"]
        try_number = int(getattr(ti, "try_number", 1) or 1)
        restore = self.choose_restore(try_number, self._catalog())
        if try_number > 1 and restore == "latest":
            self.log.info(
                "try %d of %s: resuming job %s from its latest retained checkpoint (restore=latest; "
                "the first try's restore=%r is not used again)", try_number, self.task_id, self.job_name, self.restore,
            )
        elif try_number > 1:
            self.log.info(
                "try %d of %s: job %s has no checkpoint newer than %s; restoring it again", try_number,
                self.task_id, self.job_name, restore,
            )
        else:
            self.log.info("first try: job %s starts with restore=%s", self.job_name, restore)
        self._record_decision(context, try_number, restore)
        sparkpoint_conf = self.build_sparkpoint_conf(restore)
        catalog = self._catalog()
        generation_before = catalog.current_generation()
        self.conf = {**(self.conf or {}), **sparkpoint_conf}
        self.env_vars = {**self._local_spark_environment(), **(self.env_vars or {})}
        self._secret_env = self._secret_environment()
        if self.ship_runtime:
            self._shipped_zip = build_runtime_zip()
            self.py_files = ",".join(p for p in (self.py_files, self._shipped_zip) if p)
        self._hook = None  # rebuilt with the final conf and environment
        try:
            super().execute(context)
        finally:
            process = getattr(self._hook, "_submit_sp", None)
            if process is not None and process.stdout is not None:
                process.stdout.close()  # the Spark hook leaves its log pipe open
            if self._shipped_zip:
                os.unlink(self._shipped_zip)
                self._shipped_zip = None
        result = self._read_result(catalog, generation_before)
        emit_metrics_for(catalog, every=0)  # checkpoint metrics through Airflow's Stats (never raises)
        if result is None:
            self.log.warning("job %s ended without a Sparkpoint run result (did it call job.run()?)", self.job_name)
            return None
        self.log.info("job %s generation %s %s: last batch %s, last checkpoint %s, savepoint %s",
                      self.job_name, result.get("generation"), result.get("status"), result.get("last_batch"),
                      result.get("last_checkpoint"), result.get("savepoint"))
        return result

    def _record_decision(self, context: Context, try_number: int, restore: str) -> None:
        store = context.get("task_state_store")  # Airflow 3.3+
        if store is None:
            return
        try:
            store.set("sparkpoint_restore", json.dumps({"try_number": try_number, "restore": restore}))
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            self.log.debug("could not record the restore decision in the task state store: %s", exc)

    @staticmethod
    def _read_result(catalog: Catalog, generation_before: int) -> dict[str, Any] | None:
        current = catalog.current_generation()
        for generation in range(current, generation_before, -1):
            try:
                return dict(json.loads(catalog.store.get(result_key(generation))))
            except ObjectNotFound:
                continue
        return None

    def on_kill(self) -> None:
        """Ask the job to stop cleanly (stop-with-savepoint through the control channel),
        wait up to `stop_timeout`, then fall back to the Spark hook's kill."""
        try:
            channel = ControlChannel(self._catalog())
            request = channel.submit("stop", timeout_s=self.stop_timeout, requested_by=f"on_kill:{self.task_id}")
            deadline = time.monotonic() + self.stop_timeout
            while time.monotonic() < deadline:
                process = getattr(self._hook, "_submit_sp", None)
                if process is not None and process.poll() is not None:
                    self.log.info("job %s stopped cleanly after stop request %s", self.job_name, request.id)
                    return
                time.sleep(1)
            self.log.warning("job %s did not stop within %.0fs; killing spark-submit", self.job_name,
                             self.stop_timeout)
        except Exception as exc:  # noqa: BLE001 - always fall back to the kill
            self.log.warning("clean stop of job %s failed (%s); killing spark-submit", self.job_name, exc)
        super().on_kill()
