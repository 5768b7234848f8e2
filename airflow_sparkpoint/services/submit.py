"""What a submit of a Sparkpoint job is made of, before ``spark-submit`` runs: the
``spark.sparkpoint.*`` settings (validated as the driver will validate them), the
application's path, the ``spark-submit`` this worker runs, the task try that starts it
and the credentials that reach it by environment, and whether the job may start
(`check_start`: a live run another task started is refused unless taken over).

Every check raises `ConfigError` naming the value, what was tried and what is
expected: the same input fails the same way on every try. Pure Python: no Spark, no
Airflow.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_sparkpoint import durations
from airflow_sparkpoint.checkpoints.history_records import AIRFLOW_CONTEXT_ENV, AirflowTry
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.config import PREFIX, SUBMITTER_ENV, SparkpointConfig
from airflow_sparkpoint.runtime.takeover import check_start
from airflow_sparkpoint.storage.endpoints import ENDPOINT_URL, REGION_NAME

__all__ = [
    "OPERATOR_SETTINGS", "PREFIX", "SUBMITTER_ENV", "check_parameters", "check_start", "driver_environment",
    "interval_text",
    "path_with_local_spark", "require_spark_binary", "resolve_application", "secret_environment",
    "sparkpoint_conf", "sparkpoint_settings", "start_rule", "starter_environment",
]

#: settings the operator sets itself from its parameters: the operator watches the store
#: and the job it was given, and chooses the restore target per try
OPERATOR_SETTINGS = {
    "dir": "checkpoint_dir or sparkpoint_conn_id",
    "job": "job_name",
    "restore": "restore or restore_snapshot",
}

#: a URI scheme other than ``file:`` (``s3://``, ``hdfs://``, ``local:``...): Spark fetches
#: or finds the application itself
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def check_parameters(*, commit_mode: Any, num_retained: Any, state_partitions: Any, takeover: Any) -> None:
    """The submit's own parameters, when the DAG is parsed.

    :raises ConfigError: naming the parameter, its value and what is expected.
    """
    if commit_mode not in ("checkpoint", "external"):
        raise ConfigError(f"commit_mode={commit_mode!r} is not allowed; expected 'checkpoint' or 'external'")
    if not isinstance(num_retained, int) or num_retained < 1:
        raise ConfigError(f"num_retained={num_retained!r} is not allowed; expected an integer >= 1")
    if state_partitions is not None and (
            isinstance(state_partitions, bool) or not isinstance(state_partitions, int)
            or state_partitions < 1):
        raise ConfigError(f"state_partitions={state_partitions!r} is invalid; expected an integer >= 1 "
                          "(or None: the snapshot's own number)")
    if not isinstance(takeover, bool):
        raise ConfigError(f"takeover={takeover!r} is invalid; expected True or False")


def interval_text(value: Any, *, rendered: bool = False) -> str:
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


def sparkpoint_settings(conf: Mapping[str, Any] | None, sparkpoint_conf: Mapping[str, Any]) -> dict[str, str]:
    """The ``spark.sparkpoint.*`` settings of `conf` and `sparkpoint_conf` (with or
    without the prefix), full keys; `sparkpoint_conf` wins where both set a key.

    :raises ConfigError: one of them sets a setting the operator owns (`OPERATOR_SETTINGS`).
    """
    settings: dict[str, str] = {}
    for where, values in (("conf", conf or {}), ("sparkpoint_conf", sparkpoint_conf)):
        for key, value in values.items():
            if where == "conf" and not str(key).startswith(PREFIX):
                continue
            full = key if str(key).startswith(PREFIX) else PREFIX + str(key)
            short = full.removeprefix(PREFIX)
            if short in OPERATOR_SETTINGS:
                raise ConfigError(f"{where} sets {full}={value!r}: the operator sets it "
                                  "from its parameters; use "
                                  f"{OPERATOR_SETTINGS[short]}")
            settings[full] = str(value)
    return settings


def sparkpoint_conf(
    *,
    storage_uri: str,
    storage_options: Mapping[str, Any],
    job: str,
    restore: str,
    trigger: str,
    checkpoint_interval: Any,
    num_retained: int,
    commit_mode: str,
    work_dir: str | None = None,
    state_partitions: int | None = None,
    takeover: bool = False,
    conf: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The ``spark.sparkpoint.*`` settings of a submit, validated as the job validates
    them: the store (its S3 endpoint and region, never credentials), the job, the
    restore target, the trigger, the checkpointing, and the further settings given in
    the Spark `conf` and in `extra` (the operator's ``sparkpoint_conf``).

    :raises ConfigError: a setting is invalid (before anything is submitted).
    """
    settings: dict[str, str] = {
        f"{PREFIX}dir": storage_uri,
        f"{PREFIX}job": job,
        f"{PREFIX}restore": restore,
        f"{PREFIX}trigger": trigger,
        f"{PREFIX}checkpoint.interval": interval_text(checkpoint_interval, rendered=True),
        f"{PREFIX}checkpoint.numRetained": str(num_retained),
        f"{PREFIX}commit.mode": commit_mode,
    }
    if work_dir:
        settings[f"{PREFIX}workDir"] = work_dir
    if storage_options.get(ENDPOINT_URL):
        settings[f"{PREFIX}s3.endpoint"] = str(storage_options[ENDPOINT_URL])
    if storage_options.get(REGION_NAME):
        settings[f"{PREFIX}s3.region"] = str(storage_options[REGION_NAME])
    if state_partitions is not None:
        settings[f"{PREFIX}restore.statePartitions"] = str(state_partitions)
    if takeover:
        settings[f"{PREFIX}takeover"] = "true"
    # spark.sparkpoint.* keys in conf too: validated here, not by the driver 20 s later
    settings.update(sparkpoint_settings(conf, extra or {}))
    parsed = SparkpointConfig.from_conf(settings)
    shuffle = (conf or {}).get("spark.sql.shuffle.partitions")
    if parsed.restore_state_partitions is not None and shuffle is not None and \
            str(shuffle).strip() != str(parsed.restore_state_partitions):
        # The job would refuse it too (after the submit): state partitions are shuffle partitions.
        raise ConfigError(f"spark.sql.shuffle.partitions={shuffle} contradicts state_partitions="
                          f"{parsed.restore_state_partitions}; remove it or set it to the same number")
    return settings


def secret_environment(storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The store's credentials as the AWS environment variables of spark-submit (never
    its conf, which the Spark UI shows)."""
    env = {}
    for option, variable in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                             ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                             ("aws_session_token", "AWS_SESSION_TOKEN")):
        if storage_options.get(option):
            env[variable] = str(storage_options[option])
    return env


def starter_environment(starter: AirflowTry) -> dict[str, str]:
    """The driver's view of `starter` (`records.AIRFLOW_CONTEXT_ENV`): what Airflow exports
    to the task's environment, set here explicitly, plus the map index it does not export."""
    values = {"dag_id": starter.dag_id, "task_id": starter.task_id, "run_id": starter.run_id,
              "try_number": "" if starter.try_number is None else str(starter.try_number),
              "map_index": "" if starter.map_index is None else str(starter.map_index)}
    return {AIRFLOW_CONTEXT_ENV[name]: value for name, value in values.items() if value}


def driver_environment(starter: AirflowTry, token: str) -> dict[str, str]:
    """What the driver of a submit gets by environment, in client and cluster mode alike:
    the task try that starts it (`starter_environment`) and the submit's `token`
    (`SUBMITTER_ENV`: not a secret, it only names the submit)."""
    return {**starter_environment(starter), SUBMITTER_ENV: token}


def resolve_application(application: Any, dag_file: str | None) -> str:
    """`application` as spark-submit gets it: a relative local path resolved against the
    folder of the DAG file, which must hold it; an absolute path or a URI unchanged.

    :raises ConfigError: no application; a relative path with no DAG file, or whose file
        is not there (the message names the path tried).
    """
    text = str(application or "").strip()
    if not text:
        raise ConfigError("application is empty; expected the path of the job's PySpark script")
    local = (text.removeprefix("file:") if text.startswith("file:") and not text.startswith("file://")
             else text)
    if _REMOTE.match(local) or os.path.isabs(local):
        return text
    if not dag_file:
        raise ConfigError(f"application {text!r} is a relative path and the task has "
                          "no DAG file to resolve it "
                          "against; expected a path relative to the DAG file's folder, or an absolute path")
    tried = Path(dag_file).resolve().parent / local
    if not tried.is_file():
        raise ConfigError(f"application {text!r} is a relative path, resolved against the "
                          f"DAG file's folder: {tried} "
                          "is no file; expected a path relative to that folder (e.g. "
                          "'jobs/orders.py' beside the DAG "
                          "file), or an absolute path")
    return str(tried)


def path_with_local_spark(current: Mapping[str, str]) -> str | None:
    """`current`'s PATH with this interpreter's ``bin/`` first when spark-submit is not on
    it but there (a pip-installed pyspark); None when PATH needs no change."""
    bindir = str(Path(sys.executable).parent)
    if shutil.which("spark-submit", path=current.get("PATH")) is None and os.path.exists(
        os.path.join(bindir, "spark-submit")
    ):
        return bindir + os.pathsep + current.get("PATH", os.defpath)
    return None


def require_spark_binary(binary: str, path: str | None) -> str:
    """The ``spark-submit`` (or `binary`) that `path` (a PATH) finds.

    :raises ConfigError: none: this worker has no Spark on its PATH.
    """
    found = shutil.which(binary, path=path)
    if found is None:
        raise ConfigError(
            f"{binary} (the Spark connection's spark-binary) was not found on the PATH of "
            f"this worker ({path or ''}): "
            "the Airflow side has no Spark of its own; put a Spark distribution's bin/ of "
            "the cluster's version on "
            "PATH (the worker's environment, or the operator's env_vars) and set SPARK_HOME (docs/install.md)"
        )
    return found


def start_rule(settings: Mapping[str, str]) -> dict[str, Any]:
    """What `check_start` needs to know of a submit's ``spark.sparkpoint.*`` `settings`
    (`sparkpoint_conf`'s): the cutover it is green's (``cutover``) and whether it is a
    shadow (``shadow.mode``: a zero-downtime green's warm-up, which starts beside a live
    blue). Keyword arguments for `check_start`."""
    return {"cutover": settings.get(f"{PREFIX}cutover") or None,
            "shadow": bool(settings.get(f"{PREFIX}shadow.mode"))}
