"""The cluster manager of a Spark connection (`services.cluster_manager`), built on the
Airflow side: the YARN ResourceManager's address and authentication as the Spark
provider reads them from the connection (extra ``yarn_resourcemanager_webapp_address``;
Kerberos when the connection has a keytab and principal), the Kubernetes API client as the
Spark provider gets it (``apache-airflow-providers-cncf-kubernetes``'s ``kube_client``:
Airflow's ``[kubernetes]`` settings, in-cluster or a kube config).

Used by the submit operator (both paths) and by `SparkpointRunTrigger` in the triggerer.
"""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.cluster_manager import (
    KUBERNETES,
    YARN,
    ClusterHandle,
    ClusterManager,
    KubernetesManager,
    PodApi,
    YarnManager,
    cluster_record,
)

__all__ = ["KUBERNETES_PROVIDER_MISSING", "cluster_handle", "cluster_manager", "kubernetes_api",
           "require_kubernetes_client"]

KUBERNETES_PROVIDER_MISSING = (
    "a k8s://... master needs the Kubernetes client of apache-airflow-providers-cncf-kubernetes "
    "(pip install apache-airflow-providers-cncf-kubernetes) on the Airflow worker and triggerer")


def _provider_kube_client() -> Any:
    # the Spark provider imports it when the cncf provider is installed, else leaves the
    # name out (or None): the same object its own driver-pod calls use
    from airflow.providers.apache.spark.hooks import spark_submit

    return getattr(spark_submit, "kube_client", None)


def require_kubernetes_client() -> None:
    """:raises ConfigError: the Kubernetes client is not installed (says what to install)."""
    if _provider_kube_client() is None:
        raise ConfigError(KUBERNETES_PROVIDER_MISSING)


def kubernetes_api() -> PodApi:
    """The Kubernetes ``CoreV1Api`` client.

    :raises ConfigError: it is not installed."""
    client = _provider_kube_client()
    if client is None:
        raise ConfigError(KUBERNETES_PROVIDER_MISSING)
    api: PodApi = client.get_kube_client()
    return api


def cluster_manager(kind: str, conn_id: str, hook: Any = None) -> ClusterManager:
    """The `ClusterManager` of cluster `kind` for the Spark connection `conn_id` (`hook`: its
    Spark provider hook when the caller has one; built here for YARN otherwise).

    :raises ConfigError: YARN without the ResourceManager's address in the connection,
        Kubernetes without its client, an unknown kind.
    """
    if kind == KUBERNETES:
        require_kubernetes_client()
        return KubernetesManager(kubernetes_api)
    if kind != YARN:
        raise ConfigError(f"cluster kind {kind!r} is invalid; expected {KUBERNETES} or {YARN}")
    if hook is None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        hook = SparkSubmitHook(conn_id=conn_id)
    try:
        url = hook._get_yarn_rm_base_url()
    except ValueError:
        raise ConfigError(
            f"Spark connection {conn_id!r} has no extra {hook._YARN_RM_WEBAPP_ADDRESS_EXTRA_KEY!r}: "
            "cluster mode on YARN watches and kills the application through the ResourceManager's REST "
            "API; expected its address, e.g. http://rm.example.com:8088") from None
    return YarnManager(url, auth=hook._resolved_yarn_rm_auth)


def cluster_handle(cluster: Any) -> ClusterHandle:
    """The handle of a cluster-mode driver as a `DetachedRecord` records it (``driver``,
    ``conn_id``): watched and killed through that connection's cluster manager.

    :raises ConfigError: the record is malformed or its cluster manager cannot be built.
    """
    driver, conn_id = cluster_record(cluster)
    return ClusterHandle(cluster_manager(driver.kind, conn_id), driver)
