"""What `SparkpointSubmitOperator` checks before anything runs (issue #48): the Spark
connection and its ``spark-submit``, the `application`'s path, and the
``spark.sparkpoint.*`` settings given in `conf` as well as in `sparkpoint_conf`.

Each check raises `ConfigError` naming the value, what was tried and what is expected;
the operator turns it into `SparkpointConfigFailure`, which Airflow does not retry (the
same input fails the same way on every try).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.config import PREFIX

__all__ = [
    "OPERATOR_SETTINGS",
    "SparkpointConfigFailure",
    "path_with_local_spark",
    "require_spark_binary",
    "require_spark_connection",
    "resolve_application",
    "sparkpoint_settings",
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


class SparkpointConfigFailure(AirflowFailException, ConfigError):
    """A configuration error found before anything ran: a `ConfigError` (its message names
    the value and what is expected) that is also an `AirflowFailException`, so the task
    fails without using up its retries."""


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
                raise ConfigError(f"{where} sets {full}={value!r}: the operator sets it from its parameters; use "
                                  f"{OPERATOR_SETTINGS[short]}")
            settings[full] = str(value)
    return settings


def resolve_application(application: Any, dag_file: str | None) -> str:
    """`application` as spark-submit gets it: a relative local path resolved against the
    folder of the DAG file, which must hold it; an absolute path or a URI unchanged.

    :raises ConfigError: no application; a relative path with no DAG file, or whose file
        is not there (the message names the path tried).
    """
    text = str(application or "").strip()
    if not text:
        raise ConfigError("application is empty; expected the path of the job's PySpark script")
    local = text.removeprefix("file:") if text.startswith("file:") and not text.startswith("file://") else text
    if _REMOTE.match(local) or os.path.isabs(local):
        return text
    if not dag_file:
        raise ConfigError(f"application {text!r} is a relative path and the task has no DAG file to resolve it "
                          "against; expected a path relative to the DAG file's folder, or an absolute path")
    tried = Path(dag_file).resolve().parent / local
    if not tried.is_file():
        raise ConfigError(f"application {text!r} is a relative path, resolved against the DAG file's folder: {tried} "
                          "is no file; expected a path relative to that folder (e.g. 'jobs/orders.py' beside the DAG "
                          "file), or an absolute path")
    return str(tried)


def require_spark_connection(conn_id: str) -> None:
    """:raises ConfigError: Airflow has no connection `conn_id` (the Spark provider would
        fall back to master ``yarn`` and fail there with a message about Hadoop)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(
            f"Spark connection {conn_id!r} does not exist: create it (type spark, host local[2], spark://host:7077, "
            "yarn or k8s://...; docs/tutorial.md) or pass conn_id= of one that does"
        ) from None


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
            f"{binary} (the Spark connection's spark-binary) was not found on the PATH of this worker ({path or ''}): "
            "the Airflow side has no Spark of its own; put a Spark distribution's bin/ of the cluster's version on "
            "PATH (the worker's environment, or the operator's env_vars) and set SPARK_HOME (docs/install.md)"
        )
    return found
