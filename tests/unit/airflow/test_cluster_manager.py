"""`services.cluster_manager`'s two cluster managers at their API edge: YARN's
ResourceManager as a real HTTP server on 127.0.0.1 (`tests.support.cluster_managers`), the
Kubernetes client's pod calls. What each state of the driver means to Sparkpoint, and
that a kill leaves a driver that already ended alone."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.cluster_manager import (
    ClusterDriver,
    ClusterHandle,
    KubernetesManager,
    YarnManager,
)
from tests.support.cluster_managers import NAMESPACE, POD, YARN_APP, Pods, resource_manager

APP = ClusterDriver("yarn", application_id=YARN_APP)
PODDRIVER = ClusterDriver("kubernetes", namespace=NAMESPACE, pod=POD)


@pytest.mark.parametrize(("state", "final", "expected"), [
    ("ACCEPTED", "UNDEFINED", "active"), ("RUNNING", "UNDEFINED", "active"),
    ("FINISHED", "SUCCEEDED", "succeeded"), ("FINISHED", "FAILED", "failed"), ("KILLED", "KILLED", "failed"),
    ("FAILED", "FAILED", "failed"), (None, None, "gone"),
])
def test_yarn_states(state: str | None, final: str | None, expected: str) -> None:
    with resource_manager() as rm:
        if state is not None:
            rm.apps[YARN_APP] = {"state": str(state), "finalStatus": str(final)}
        manager = YarnManager(rm.url)
        assert manager.status(APP).state == expected
        assert [r[:2] for r in rm.requests] == [("GET", f"/ws/v1/cluster/apps/{YARN_APP}")]


def test_yarn_kill_is_a_put_of_killed_and_only_while_it_runs() -> None:
    with resource_manager() as rm:
        rm.apps[YARN_APP] = {"state": "RUNNING", "finalStatus": "UNDEFINED"}
        handle = ClusterHandle(YarnManager(rm.url), APP)
        assert handle.active() and not handle.gone()
        assert handle.kill() == f"killed YARN application {YARN_APP} (HTTP 202)"
        assert ([r[1:3] for r in rm.kills()]
                == [(f"/ws/v1/cluster/apps/{YARN_APP}/state", {"state": "KILLED"})])
        assert handle.gone() and not handle.active()
        assert handle.kill().startswith("not killed:") and len(rm.kills()) == 1


def test_an_unreachable_resource_manager_is_unknown_never_gone() -> None:
    with resource_manager() as rm:
        url = rm.url
    handle = ClusterHandle(YarnManager(url, timeout_s=2), APP)
    assert handle.manager.status(APP).state == "unknown" and not handle.gone() and not handle.active()
    assert "failed" in handle.kill()
    with pytest.raises(ConfigError, match="expected http"):
        YarnManager("rm.example.com:8088")


class Refusing(Pods):
    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        raise RuntimeError("connection refused")


@pytest.mark.parametrize(("phase", "expected"), [
    ("Pending", "active"), ("Running", "active"), ("Succeeded", "succeeded"), ("Failed", "failed"),
    ("Unknown", "unknown"), (None, "gone"),
])
def test_kubernetes_pod_phases(phase: str | None, expected: str) -> None:
    pods = Pods()
    if phase is not None:
        pods.phases[(NAMESPACE, POD)] = phase
    assert KubernetesManager(lambda: pods).status(PODDRIVER).state == expected
    assert [c[:3] for c in pods.calls] == [("read", POD, NAMESPACE)]


def test_kubernetes_kill_deletes_a_running_pod_only() -> None:
    pods = Pods()
    built: list[int] = []

    def api() -> Pods:
        built.append(1)
        return pods

    handle = ClusterHandle(KubernetesManager(api), PODDRIVER)
    pods.phases[(NAMESPACE, POD)] = "Succeeded"
    assert handle.kill().startswith("not killed:") and pods.of("delete") == []
    pods.phases[(NAMESPACE, POD)] = "Running"
    assert handle.kill() == f"deleted driver pod {NAMESPACE}:{POD}"
    assert [c[1:3] for c in pods.of("delete")] == [(POD, NAMESPACE)] and handle.gone()
    assert built == [1], "the Kubernetes client is built once"
    assert KubernetesManager(Refusing).status(PODDRIVER).state == "unknown"


@pytest.mark.parametrize(("data", "why"), [
    ({"kind": "kubernetes", "namespace": "", "pod": "p-driver"}, "a namespace and a pod"),
    ({"kind": "yarn", "application_id": "app_1"}, "application_<cluster timestamp>"),
    ({"kind": "standalone"}, "kind='standalone'"),
    ("x", "expected a mapping"),
])
def test_a_malformed_driver_record_is_refused(data: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        ClusterDriver.from_json(data)
