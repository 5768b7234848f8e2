"""Cluster deploy mode on Kubernetes and YARN: the one home of every call to the cluster
manager (issue #50).

In cluster mode the driver runs on the cluster (a Kubernetes pod, a YARN application
master), out of reach of the Airflow task's signals. The catalog tracks the run exactly
as for a detached client-mode driver (its generation claim, heartbeat, status and result:
`services.follow`); the cluster manager is asked only what the catalog cannot say:

- `check_deploy_mode`: which master and deploy mode combinations run (cluster mode on
  ``k8s://`` and ``yarn`` only, with a store the cluster reaches), refused with the value
  and what is expected before anything is submitted;
- `submit` and `parse_submit_output`: run spark-submit with the cluster's
  ``waitAppCompletion=false`` (it returns once the driver is submitted) and read the
  driver's place from its output (`ClusterDriver`: ``namespace:pod`` or the YARN
  application id);
- `ClusterManager` (`KubernetesManager`, `YarnManager`): the driver's state and its kill
  (Kubernetes: read and delete the driver pod; YARN: the ResourceManager's REST API,
  ``GET /ws/v1/cluster/apps/{id}`` and ``PUT .../state {"state": "KILLED"}``);
- `ClusterHandle`: a driver on the cluster as `services.follow` stops and watches it
  (never by process id: nothing of the client-mode process kill applies to it).

No Airflow: the Airflow side builds the managers from its Spark connection
(`hooks.spark_cluster`), the Kubernetes API client included.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from airflow_sparkpoint.exceptions import ConfigError, InvalidPath
from airflow_sparkpoint.storage import split_uri

__all__ = [
    "ACTIVE", "CLUSTER_KINDS", "ENDED_STATES", "GONE", "KUBERNETES", "SUBMIT_TIMEOUT_S",
    "WAIT_APP_COMPLETION", "YARN", "ClusterDriver", "ClusterHandle", "ClusterManager", "DriverState",
    "KubernetesManager", "PodApi", "Submission", "YarnManager", "check_deploy_mode", "cluster_kind",
    "cluster_record", "deploy_mode", "parse_submit_output", "submit",
]

log = logging.getLogger(__name__)

KUBERNETES = "kubernetes"
YARN = "yarn"
CLUSTER_KINDS = (KUBERNETES, YARN)
#: the conf that makes spark-submit return once the driver is submitted (set by the submit)
WAIT_APP_COMPLETION = {KUBERNETES: "spark.kubernetes.submission.waitAppCompletion",
                       YARN: "spark.yarn.submit.waitAppCompletion"}
#: a driver's states as the cluster manager reports them (`DriverState.state`)
ACTIVE, SUCCEEDED, FAILED, GONE, UNKNOWN = "active", "succeeded", "failed", "gone", "unknown"
ENDED_STATES = (SUCCEEDED, FAILED, GONE)
#: how long a cluster-mode spark-submit may take to submit (it does not wait for the run)
SUBMIT_TIMEOUT_S = 600.0
#: the last lines of spark-submit's output kept for an error message
_TAIL_LINES = 40

_YARN_APP_RE = re.compile(r"\b(application_\d+_\d+)\b")
# Spark's Kubernetes client: "Deployed Spark application X with application ID spark-... and
# submission ID <namespace>:<pod> into Kubernetes"; its pod watcher: "pod name: <pod>",
# "namespace: <namespace>" (one field a line)
_K8S_SUBMISSION_RE = re.compile(
    r"submission ID ([a-z0-9]([-a-z0-9]*[a-z0-9])?):([a-z0-9][-.a-z0-9]*-driver)\b")
_K8S_POD_RE = re.compile(r"^\s*pod name: ([a-z0-9][-.a-z0-9]*-driver)\s*$")
_K8S_NAMESPACE_RE = re.compile(r"^\s*namespace: ([a-z0-9]([-a-z0-9]*[a-z0-9])?)\s*$")
_YARN_ACTIVE = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING")


def cluster_kind(master: str) -> str | None:
    """`KUBERNETES` for a ``k8s://`` master, `YARN` for ``yarn``, else None."""
    text = master.strip().lower()
    if text.startswith("k8s://"):
        return KUBERNETES
    if text == "yarn" or text.startswith("yarn-"):
        return YARN
    return None


def deploy_mode(connection_mode: Any, conf: Mapping[str, Any] | None) -> str:
    """The deploy mode asked for: the operator's or the Spark connection's (the provider's
    resolved ``deploy_mode``), else ``spark.submit.deployMode`` in `conf`; ``client`` by default.

    :raises ConfigError: a mode other than client or cluster.
    """
    mode = str(connection_mode or (conf or {}).get("spark.submit.deployMode") or "client").strip().lower()
    if mode not in ("client", "cluster"):
        raise ConfigError(f"deploy_mode={mode!r} is invalid; expected 'client' or 'cluster'")
    return mode


def check_deploy_mode(*, task_id: str, master: str, mode: str, storage_uri: str,
                      source: str = "the operator, the Spark connection or spark.submit.deployMode",
                      ) -> str | None:
    """The cluster manager a submit in `mode` on `master` goes through (`KUBERNETES`,
    `YARN`), or None for client mode.

    Cluster mode runs where the cluster manager can also watch and kill the driver:
    Kubernetes and YARN. Spark standalone's cluster mode does not run Python
    applications, and a local master has no cluster. The driver then reaches the store
    from the cluster: a local path (or ``file:``) on this worker is not the directory a
    pod or an application master sees.

    :raises ConfigError: naming the task, the master or the store and what is expected.
    """
    if mode != "cluster":
        return None
    kind = cluster_kind(master)
    asked = f"SparkpointSubmitOperator {task_id!r}: deploy_mode='cluster' (from {source})"
    if kind is None:
        text = master.strip().lower()
        if text.startswith("spark://"):
            raise ConfigError(f"{asked} on the standalone master {master!r} is refused: Spark standalone's "
                              "cluster mode does not run Python applications; expected client mode there, "
                              "or a k8s://... or yarn master for cluster mode")
        if text.startswith("local"):
            raise ConfigError(f"{asked} on the local master {master!r} is refused: a local master has no "
                              "cluster to run the driver on; expected client mode")
        raise ConfigError(f"{asked} on master {master!r} is refused; expected a k8s://... or yarn master "
                          "(cluster mode runs where the cluster manager can also watch and kill the driver)")
    try:
        scheme = split_uri(storage_uri)[0]
    except InvalidPath as exc:
        raise ConfigError(f"{asked}: {exc}") from None
    if scheme != "s3":
        raise ConfigError(f"{asked} on {kind} is refused with the store {storage_uri!r}: in cluster mode the "
                          "driver runs on the cluster, where a path of this worker is not the same "
                          "directory; "
                          "expected a store the cluster reaches (s3://bucket/prefix)")
    return kind


@dataclass(frozen=True)
class ClusterDriver:
    """Where a cluster-mode driver runs: a Kubernetes pod (`namespace`, `pod`) or a YARN
    application (`application_id`). Its JSON is the launch record's ``driver``
    (`checkpoints.launches`)."""

    kind: str
    namespace: str = ""
    pod: str = ""
    application_id: str = ""

    def __post_init__(self) -> None:
        if self.kind == KUBERNETES and not (self.namespace and self.pod):
            raise ConfigError(f"cluster driver {self!r} is invalid; expected a namespace and a pod")
        if self.kind == YARN and not _YARN_APP_RE.fullmatch(self.application_id):
            raise ConfigError(f"cluster driver application_id={self.application_id!r} is invalid; "
                              "expected application_<cluster timestamp>_<number>")
        if self.kind not in CLUSTER_KINDS:
            raise ConfigError(f"cluster driver kind={self.kind!r} is invalid; expected one of "
                              + ", ".join(CLUSTER_KINDS))

    @property
    def id(self) -> str:
        """``namespace:pod`` or the application id (what on-call engineers look for)."""
        return f"{self.namespace}:{self.pod}" if self.kind == KUBERNETES else self.application_id

    def describe(self) -> str:
        return f"Kubernetes pod {self.id}" if self.kind == KUBERNETES else f"YARN application {self.id}"

    def to_json(self) -> dict[str, str]:
        if self.kind == KUBERNETES:
            return {"kind": self.kind, "namespace": self.namespace, "pod": self.pod}
        return {"kind": self.kind, "application_id": self.application_id}

    @classmethod
    def from_json(cls, data: Any) -> ClusterDriver:
        """Parse a record read from a shared place (trigger kwargs, the task state store).

        :raises ConfigError: not a cluster driver record.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"cluster driver record {data!r} is invalid; expected a mapping")
        fields = {name: data.get(name, "") for name in ("kind", "namespace", "pod", "application_id")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise ConfigError(f"cluster driver record {dict(data)!r} is invalid; expected string fields")
        return cls(**fields)


def cluster_record(data: Any) -> tuple[ClusterDriver, str]:
    """The driver and the Spark connection of a ``{"driver": ..., "conn_id": ...}`` record
    (the task state store's, a trigger's kwargs: read from a shared place), checked.

    :raises ConfigError: a malformed record.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("conn_id"), str) or not data["conn_id"]:
        raise ConfigError(f"cluster record {data!r} is invalid; expected a driver and a Spark conn_id")
    return ClusterDriver.from_json(data.get("driver")), str(data["conn_id"])


def parse_submit_output(kind: str, lines: Iterable[str], *,
                        namespace: str | None = None) -> ClusterDriver | None:
    """The driver a cluster-mode spark-submit started, from its output `lines`, or None
    when they do not name it. Kubernetes: the ``submission ID <namespace>:<pod>`` line
    (else the pod watcher's ``pod name:`` with its ``namespace:``, else `namespace`, else
    ``default``); YARN: the application id (``application_<ts>_<n>``)."""
    pod = found_namespace = None
    for line in lines:
        if kind == YARN:
            match = _YARN_APP_RE.search(line)
            if match:
                return ClusterDriver(YARN, application_id=match.group(1))
            continue
        submission = _K8S_SUBMISSION_RE.search(line)
        if submission:
            return ClusterDriver(KUBERNETES, namespace=submission.group(1), pod=submission.group(3))
        pod_line, namespace_line = _K8S_POD_RE.match(line), _K8S_NAMESPACE_RE.match(line)
        if pod_line:
            pod = pod_line.group(1)
        elif namespace_line and pod is not None and found_namespace is None:
            found_namespace = namespace_line.group(1)
    if pod is None:
        return None
    return ClusterDriver(KUBERNETES, namespace=found_namespace or namespace or "default", pod=pod)


@dataclass(frozen=True)
class Submission:
    """What a cluster-mode spark-submit did: its exit code, the driver it named (None: it
    named none) and its last output lines."""

    exit_code: int
    driver: ClusterDriver | None
    tail: Sequence[str]


def submit(command: Sequence[str], env: Mapping[str, str], *, kind: str, namespace: str | None = None,
           on_line: Callable[[str], None] | None = None, timeout_s: float = SUBMIT_TIMEOUT_S) -> Submission:
    """Run a cluster-mode spark-submit (`command`, with ``waitAppCompletion=false``: it ends
    once the driver is submitted), passing each output line to `on_line`; killed after
    `timeout_s` seconds.

    :raises OSError: spark-submit cannot start.
    """
    process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=dict(env), text=True, errors="replace")
    timer = threading.Timer(timeout_s, process.kill)
    timer.daemon = True
    timer.start()
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    seen: list[str] = []
    try:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            seen.append(line)
            if on_line is not None:
                on_line(line)
        code = process.wait()
    finally:
        timer.cancel()
        if process.stdout is not None:
            process.stdout.close()
    return Submission(code, parse_submit_output(kind, seen, namespace=namespace), tuple(tail))


@dataclass(frozen=True)
class DriverState:
    """A driver's state as the cluster manager reports it (`ACTIVE`, `SUCCEEDED`, `FAILED`,
    `GONE`: unknown to it; `UNKNOWN`: it could not be asked) and its words about it."""

    state: str
    detail: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


class ClusterManager(Protocol):
    """What Sparkpoint asks a cluster manager about a driver."""

    def status(self, driver: ClusterDriver) -> DriverState:
        """The driver's state; never raises (`UNKNOWN` with the reason)."""
        ...

    def kill(self, driver: ClusterDriver) -> str:
        """Kill the driver unless it ended; what was done, for the log; never raises."""
        ...


class PodApi(Protocol):
    """The two calls of the Kubernetes client (``CoreV1Api``) Sparkpoint makes."""

    def read_namespaced_pod(self, name: str, namespace: str) -> Any: ...

    def delete_namespaced_pod(self, name: str, namespace: str) -> Any: ...


def _http_status(exc: BaseException) -> int | None:
    # the Kubernetes client's ApiException carries the HTTP status (the client is optional:
    # not imported here, its exception type is not named)
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class KubernetesManager:
    """The driver pod through the Kubernetes API (`api` gives a ``CoreV1Api``-like client)."""

    def __init__(self, api: Callable[[], PodApi]) -> None:
        self._factory = api
        self._client: PodApi | None = None

    def _api(self) -> PodApi:
        if self._client is None:  # built once: loading the cluster's credentials is not free
            self._client = self._factory()
        return self._client

    def status(self, driver: ClusterDriver) -> DriverState:
        try:
            pod = self._api().read_namespaced_pod(name=driver.pod, namespace=driver.namespace)
        except Exception as exc:  # noqa: BLE001 - the API's errors, whatever the client raises
            if _http_status(exc) == 404:
                return DriverState(GONE, f"pod {driver.id} not found")
            return DriverState(UNKNOWN, f"cannot read pod {driver.id}: {exc}")
        phase = str(getattr(getattr(pod, "status", None), "phase", "") or "")
        phases = {"Pending": ACTIVE, "Running": ACTIVE, "Succeeded": SUCCEEDED, "Failed": FAILED}
        state = phases.get(phase, UNKNOWN)
        return DriverState(state, f"pod {driver.id} phase {phase or '?'}")

    def kill(self, driver: ClusterDriver) -> str:
        state = self.status(driver)
        if state.ended:
            return f"not killed: {state.detail} (ended)"
        try:
            self._api().delete_namespaced_pod(name=driver.pod, namespace=driver.namespace)
        except Exception as exc:  # noqa: BLE001 - best effort: the reason goes to the log
            if _http_status(exc) == 404:
                return f"pod {driver.id} was already gone"
            return f"delete of pod {driver.id} failed: {exc}"
        return f"deleted driver pod {driver.id}"


class YarnManager:
    """The application through the YARN ResourceManager's REST API at `base_url`
    (``http://rm:8088``), with `auth` (a ``requests`` auth, e.g. Kerberos) if given."""

    def __init__(self, base_url: str, *, auth: Any = None, timeout_s: float = 30.0) -> None:
        if not isinstance(base_url, str) or "://" not in base_url:
            raise ConfigError(f"YARN ResourceManager address {base_url!r} is invalid; expected http(s)://host:port")
        self.base_url = base_url.rstrip("/")
        self._auth = auth
        self._timeout = timeout_s

    def _url(self, driver: ClusterDriver) -> str:
        return f"{self.base_url}/ws/v1/cluster/apps/{driver.application_id}"

    def status(self, driver: ClusterDriver) -> DriverState:
        import requests

        try:
            response = requests.get(self._url(driver), auth=self._auth, timeout=self._timeout)
        except requests.RequestException as exc:
            return DriverState(UNKNOWN, f"cannot ask the ResourceManager about {driver.id}: {exc}")
        if response.status_code == 404:
            return DriverState(GONE, f"YARN application {driver.id} not found")
        try:
            response.raise_for_status()
            app = response.json()["app"]
            state, final = str(app["state"]), str(app.get("finalStatus") or "")
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            return DriverState(UNKNOWN, f"unexpected ResourceManager answer for {driver.id}: "
                                        f"HTTP {response.status_code}, {exc}")
        detail = f"YARN application {driver.id} {state}/{final or '-'}"
        if state in _YARN_ACTIVE:
            return DriverState(ACTIVE, detail)
        if state == "FINISHED" and final == "SUCCEEDED":
            return DriverState(SUCCEEDED, detail)
        return DriverState(FAILED, f"{detail}: {str(app.get('diagnostics') or '')[:500]}".rstrip(": "))

    def kill(self, driver: ClusterDriver) -> str:
        import requests

        state = self.status(driver)
        if state.ended:
            return f"not killed: {state.detail} (ended)"
        try:
            response = requests.put(f"{self._url(driver)}/state", json={"state": "KILLED"}, auth=self._auth,
                                    timeout=self._timeout)
        except requests.RequestException as exc:
            return f"kill of YARN application {driver.id} failed: {exc}"
        if response.status_code in (200, 202):
            return f"killed YARN application {driver.id} (HTTP {response.status_code})"
        return (f"kill of YARN application {driver.id} refused: HTTP {response.status_code} "
                f"{response.text[:200]}")


@dataclass
class ClusterHandle:
    """A driver on the cluster as `services.follow` watches and stops it: through its
    cluster manager only, never by a process id. `seen` is the state its last `active` or
    `gone` read: what a judgement on it names (a second read may already say otherwise)."""

    manager: ClusterManager
    driver: ClusterDriver
    seen: DriverState | None = field(default=None, compare=False)

    #: the submit's deploy mode, as the catalog's launch record names it
    deploy_mode: ClassVar[str] = "cluster"

    def describe(self) -> str:
        return self.driver.describe()

    def launch_json(self) -> dict[str, Any]:
        """The driver as the catalog's launch record names it (`checkpoints.launches`)."""
        return self.driver.to_json()

    def _read(self) -> DriverState:
        self.seen = self.manager.status(self.driver)
        return self.seen

    def active(self) -> bool:
        """Whether the cluster manager says it still runs."""
        return self._read().state == ACTIVE

    def gone(self) -> bool:
        """Whether the cluster manager says it ended (not when it cannot be asked)."""
        return self._read().ended

    def kill(self) -> str:
        return self.manager.kill(self.driver)

    def where(self) -> dict[str, Any]:
        return {"driver": self.driver.describe()}
