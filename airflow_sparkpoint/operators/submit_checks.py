"""What `SparkpointSubmitOperator` checks before anything runs (issue #48): its two
connections (the store's and Spark's), Spark's master and deploy mode (cluster mode on
Kubernetes and YARN only, issue #50) and ``spark-submit``, the
`application`'s path, and the ``spark.sparkpoint.*`` settings given in `conf` as well as
in `sparkpoint_conf` (those rules are `services.submit`'s).

Each check raises `ConfigError` naming the value, what was tried and what is expected;
the operator turns it into `SparkpointConfigFailure`, which Airflow does not retry (the
same input fails the same way on every try).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.hooks.spark_cluster import KUBERNETES_PROVIDER_MISSING, cluster_manager
from airflow_sparkpoint.services.cluster_manager import check_deploy_mode as check_deploy_mode_on
from airflow_sparkpoint.services.cluster_manager import deploy_mode
from airflow_sparkpoint.services.submit import (
    OPERATOR_SETTINGS,
    path_with_local_spark,
    require_spark_binary,
    resolve_application,
    sparkpoint_settings,
)

__all__ = [
    "OPERATOR_SETTINGS",
    "SparkpointConfigFailure",
    "check_deploy_mode",
    "check_spark",
    "path_with_local_spark",
    "require_spark_binary",
    "require_spark_connection",
    "require_sparkpoint_connection",
    "resolve_application",
    "sparkpoint_settings",
]


class SparkpointConfigFailure(AirflowFailException, ConfigError):
    """A configuration error found before anything ran: a `ConfigError` (its message names
    the value and what is expected) that is also an `AirflowFailException`, so the task
    fails without using up its retries."""


def _require_connection(conn_id: str, message: str) -> None:
    """:raises ConfigError: `message`, when Airflow has no connection `conn_id`."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(message) from None


def require_spark_connection(conn_id: str) -> None:
    """:raises ConfigError: Airflow has no connection `conn_id` (the Spark provider would
        fall back to master ``yarn`` and fail there with a message about Hadoop)."""
    _require_connection(conn_id, f"Spark connection {conn_id!r} does not exist: create it (type spark, host "
                                 "local[2], spark://host:7077, yarn or k8s://...; docs/tutorial.md) or pass "
                                 "conn_id= of one that does")


def require_sparkpoint_connection(conn_id: str | None) -> None:
    """:raises ConfigError: Airflow has no connection `conn_id` (the store's; None: a
        `checkpoint_dir` was given instead), named as the store's with what to create."""
    if conn_id:
        _require_connection(conn_id, f"Sparkpoint connection {conn_id!r} does not exist: create it (type "
                                     "sparkpoint, host the storage root: an absolute path, file:///path or "
                                     "s3://bucket/prefix; docs/tutorial.md), or pass sparkpoint_conn_id= of "
                                     "one that does or checkpoint_dir=")


def check_deploy_mode(operator: Any, hook: Any) -> str | None:
    """The cluster manager of a cluster-mode submit (``kubernetes`` or ``yarn``), or None
    for client mode (`services.cluster_manager.check_deploy_mode`: cluster mode on
    ``k8s://`` and ``yarn`` masters only, with a store the cluster reaches, and a cluster
    manager this worker can ask: the Kubernetes client, YARN's ResourceManager address).

    :raises ConfigError: a refused combination, naming the master, mode or store.
    """
    connection: Mapping[str, Any] = hook._connection
    mode = deploy_mode(connection.get("deploy_mode"), operator.conf)
    kind = check_deploy_mode_on(task_id=operator.task_id, master=str(connection.get("master") or ""),
                                mode=mode,
                                storage_uri=operator.sparkpoint_hook.storage_uri,
                                source=f"the operator, the {operator._conn_id!r} connection's deploy-mode or "
                                       "spark.submit.deployMode")
    if kind is not None:
        cluster_manager(kind, operator._conn_id, hook)  # builds only: nothing is asked yet
    return kind


def check_spark(operator: Any) -> Any:
    """The Spark provider's hook of a `SparkpointSubmitOperator`, once its Sparkpoint
    connection exists and its Spark connection, deploy mode and ``spark-submit`` are known
    to be usable; its relative `application` resolved and its ``cluster_kind`` set (None:
    client mode).

    :raises ConfigError: naming what is missing or refused.
    """
    require_sparkpoint_connection(operator.sparkpoint_conn_id)
    require_spark_connection(operator._conn_id)  # else the provider falls back to master yarn
    try:
        hook = operator._get_hook()
    except (NameError, RuntimeError) as exc:
        # the Spark provider's hook of a k8s:// master without the cncf provider: NameError
        # (no kube_client name) or RuntimeError ("kubernetes dependencies are not installed")
        if isinstance(exc, NameError) or "kubernetes" in str(exc).lower():
            raise ConfigError(KUBERNETES_PROVIDER_MISSING) from exc
        raise
    operator.cluster_kind = check_deploy_mode(operator, hook)
    environment = {**os.environ, **(operator.env_vars or {})}
    path = path_with_local_spark(environment)
    require_spark_binary(str(hook._connection.get("spark_binary") or "spark-submit"),
                         path or environment.get("PATH", os.defpath))
    operator.application = resolve_application(operator.application,
                                               operator.dag.fileloc if operator.has_dag() else None)
    return hook
