"""The Kubernetes and YARN edges of cluster deploy mode (issue #50), for tests: no cluster
runs here, so only the cluster manager's API is stood in for.

- `ResourceManager`: a real HTTP server on 127.0.0.1 (a free port) speaking the two YARN
  ResourceManager REST endpoints Sparkpoint uses (``GET /ws/v1/cluster/apps/{id}``,
  ``PUT /ws/v1/cluster/apps/{id}/state``); it records every request with its time.
- `Pods`: the Kubernetes client's ``CoreV1Api`` calls Sparkpoint makes
  (``read_namespaced_pod``, ``delete_namespaced_pod``), with the client's 404 exception.
- `fake_spark_submit`: a ``spark-submit`` first on PATH that records its command line and
  prints what a cluster-mode spark-submit prints (the lines below), then exits; with a
  `ClusterDriver` expecting it, only once the cluster created the driver (as the real one
  returns once the pod or application exists).
- `ClusterDriver`: what the driver does to the catalog once the cluster started it (claim
  with the submit token it was given through ``spark.*.driverEnv``/``appMasterEnv``,
  heartbeat, answer a cancel or not, finish), and the cluster's side of its end (the pod's
  phase, the application's state).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from typing_extensions import Self

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.history_records import generation_details
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from tests.support.records import write_status

__all__ = ["K8S_SUBMIT_OUTPUT", "K8S_WATCHER_OUTPUT", "NAMESPACE", "POD", "YARN_APP", "YARN_SUBMIT_OUTPUT",
           "ApiException", "ClusterDriver", "Pods", "ResourceManager", "conf_of", "fake_spark_submit",
           "resource_manager"]

YARN_APP = "application_1764383000000_0007"
POD = "orders-7f3a9c8d2e1b4a56-driver"
NAMESPACE = "spark-jobs"

#: Spark 4's Kubernetes client with waitAppCompletion=false (LoggingPodStatusWatcherImpl)
K8S_SUBMIT_OUTPUT = f"""\
26/11/29 02:40:00 WARN Utils: Your hostname resolves to a loopback address
26/11/29 02:40:01 INFO SparkKubernetesClientFactory: Auto-configuring K8S client using current context \
from users K8S config file
26/11/29 02:40:01 INFO KerberosConfDriverFeatureStep: You have not specified a krb5.conf file locally \
or via a ConfigMap.
26/11/29 02:40:02 INFO LoggingPodStatusWatcherImpl: State changed, new state:
\t pod name: {POD}
\t namespace: {NAMESPACE}
\t labels: spark-app-name -> orders, spark-app-selector -> spark-1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6, \
spark-role -> driver, spark-version -> 4.2.0
\t pod uid: 3f1c2b7e-8a9d-4c5b-9e0f-1a2b3c4d5e6f
\t creation time: 2026-11-29T02:40:02Z
\t service account name: spark
\t volumes: spark-local-dir-1, spark-conf-volume-driver, kube-api-access-x7k2p
\t node name: N/A
\t start time: N/A
\t phase: Pending
\t container status: N/A
26/11/29 02:40:02 INFO LoggingPodStatusWatcherImpl: Deployed Spark application orders with application ID \
spark-1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6 and submission ID {NAMESPACE}:{POD} into Kubernetes
26/11/29 02:40:02 INFO ShutdownHookManager: Shutdown hook called
26/11/29 02:40:02 INFO ShutdownHookManager: Deleting directory /tmp/spark-5c0d8f3e-0a4b-4c2d-9f1e-2b3c4d5e6f70
"""
#: an older client that prints only the pod watcher's report
K8S_WATCHER_OUTPUT = "\n".join(line for line in K8S_SUBMIT_OUTPUT.splitlines() if "submission ID" not in line)
#: Spark 4's YARN client with spark.yarn.submit.waitAppCompletion=false
YARN_SUBMIT_OUTPUT = f"""\
26/11/29 02:40:00 INFO DefaultNoHARMFailoverProxyProvider: Connecting to ResourceManager at \
rm.example.com/10.0.0.5:8032
26/11/29 02:40:01 INFO Client: Requesting a new application from cluster with 3 NodeManagers
26/11/29 02:40:01 INFO Client: Setting up container launch context for our AM
26/11/29 02:40:01 INFO Client: Preparing resources for our AM container
26/11/29 02:40:02 INFO Client: Submitting application {YARN_APP} to ResourceManager
26/11/29 02:40:02 INFO YarnClientImpl: Submitted application {YARN_APP}
26/11/29 02:40:02 INFO Client: Application report for {YARN_APP} (state: ACCEPTED)
26/11/29 02:40:02 INFO Client:
\t client token: N/A
\t diagnostics: AM container is launched, waiting for AM container to Register with RM
\t ApplicationMaster host: N/A
\t queue: default
\t start time: 1764384002000
\t final status: UNDEFINED
\t tracking URL: http://rm.example.com:8088/proxy/{YARN_APP}/
\t user: airflow
26/11/29 02:40:02 INFO ShutdownHookManager: Shutdown hook called
"""


class ApiException(Exception):  # the Kubernetes client's name
    """The Kubernetes client's ``ApiException``: the HTTP status in `status`."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"({status}) Reason: {reason}")
        self.status = status


class Pods:
    """The driver pods of a fake cluster and the calls made to them (``(call, name,
    namespace, epoch time)``)."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, str, str, float]] = []
        self.lock = threading.Lock()

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        with self.lock:
            self.calls.append(("read", name, namespace, time.time()))
            phase = self.phases.get((namespace, name))
        if phase is None:
            raise ApiException(404, "Not Found")
        return types.SimpleNamespace(status=types.SimpleNamespace(phase=phase))

    def delete_namespaced_pod(self, name: str, namespace: str) -> Any:
        with self.lock:
            self.calls.append(("delete", name, namespace, time.time()))
            if self.phases.pop((namespace, name), None) is None:
                raise ApiException(404, "Not Found")
        return types.SimpleNamespace(status="Success")

    def of(self, call: str) -> list[tuple[str, str, str, float]]:
        with self.lock:
            return [c for c in self.calls if c[0] == call]

    def client(self) -> Any:
        """What the cncf provider's ``kube_client`` module gives the Spark provider."""
        return types.SimpleNamespace(get_kube_client=lambda **_kw: self, ApiException=ApiException)


class _RMHandler(BaseHTTPRequestHandler):
    server: ResourceManager

    def _app_id(self) -> str | None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:4] == ["ws", "v1", "cluster", "apps"] and len(parts) >= 5:
            return parts[4]
        return None

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        app_id = self._app_id()
        self.server.record("GET", self.path, None)
        app = self.server.app(app_id or "")
        if app is None or self.path.rstrip("/").endswith("/state"):
            self._send(404, {"RemoteException": {"exception": "NotFoundException",
                                                 "message": f"app with id: {app_id} not found"}})
            return
        self._send(200, {"app": {"id": app_id, "state": app["state"], "finalStatus": app["finalStatus"],
                                 "diagnostics": app.get("diagnostics", "")}})

    def do_PUT(self) -> None:
        app_id = self._app_id()
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        self.server.record("PUT", self.path, body)
        if not self.path.rstrip("/").endswith("/state"):
            self._send(404, {})
            return
        with self.server.lock:
            app = self.server.apps.get(app_id or "")
            if app is not None and body == {"state": "KILLED"}:
                app.update(state="KILLED", finalStatus="KILLED", diagnostics="Application killed by user.")
            state = None if app is None else app["state"]
        if state is None:
            self._send(404, {})
            return
        self._send(202, {"state": state})

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ResourceManager(ThreadingHTTPServer):
    """A YARN ResourceManager's REST API on 127.0.0.1: `apps` (id -> state, finalStatus;
    changed under `lock` once it serves), `requests` (method, path, JSON body, epoch time)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RMHandler)
        self.apps: dict[str, dict[str, str]] = {}
        self.requests: list[tuple[str, str, Any, float]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def app(self, app_id: str) -> dict[str, str] | None:
        """A copy of application `app_id` (its fields read together), None if unknown."""
        with self.lock:
            app = self.apps.get(app_id)
            return None if app is None else dict(app)

    def record(self, method: str, path: str, body: Any) -> None:
        with self.lock:
            self.requests.append((method, path, body, time.time()))

    def kills(self) -> list[tuple[str, str, Any, float]]:
        with self.lock:
            return [r for r in self.requests if r[0] == "PUT"]


@contextmanager
def resource_manager() -> Iterator[ResourceManager]:
    """A `ResourceManager` serving on a free port; stopped at the end."""
    server = ResourceManager()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _expected(calls: Path, index: int) -> Path:
    # a ClusterDriver's mark: submit number `index` is answered by a driver the cluster creates
    return calls.with_name(f"{calls.name}.expected-{index}")


def _created(calls: Path, index: int) -> Path:
    # the ClusterDriver's mark: the cluster created the driver of submit `index`
    return calls.with_name(f"{calls.name}.created-{index}")


def fake_spark_submit(bin_dir: Path, calls: Path) -> Path:
    """A ``spark-submit`` in `bin_dir` that appends its command line (a JSON list) to
    `calls`, waits (up to 120 s) until the cluster created the driver when a
    `ClusterDriver` expects this submit (the real one returns once the pod or the
    application exists: the caller may ask the cluster about it at once), prints the file
    named by ``FAKE_SUBMIT_OUTPUT`` and exits with ``FAKE_SUBMIT_EXIT`` (0 by default)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "spark-submit"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv) + '\\n')\n"
        f"with open({str(calls)!r}) as f:\n"
        "    index = sum(1 for line in f if line.endswith('\\n')) - 1\n"
        f"expected = {str(calls)!r} + '.expected-' + str(index)\n"  # _expected
        f"created = {str(calls)!r} + '.created-' + str(index)\n"  # _created
        "deadline = time.monotonic() + 120\n"
        "while os.path.exists(expected) and not os.path.exists(created):\n"
        "    if time.monotonic() > deadline:\n"
        "        sys.exit('fake spark-submit: the cluster did not create the driver within 120 s')\n"
        "    time.sleep(0.01)\n"
        "output = os.environ.get('FAKE_SUBMIT_OUTPUT')\n"
        "if output:\n"
        "    sys.stdout.write(open(output).read())\n"
        "sys.exit(int(os.environ.get('FAKE_SUBMIT_EXIT', '0')))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return script


def conf_of(argv: list[str]) -> dict[str, str]:
    """The ``--conf key=value`` pairs of a spark-submit command line."""
    return dict(argv[i + 1].split("=", 1) for i, token in enumerate(argv) if token == "--conf")


def submitted(calls: Path) -> list[list[str]]:
    """The command lines the fake spark-submit was run with (whole lines: one being
    written is not yet a command line)."""
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines(keepends=True) if line.endswith("\n")]


class ClusterDriver:
    """The driver a cluster started, seen from the catalog and the cluster manager.

    It waits for spark-submit number `index` (`calls`), creates its pod (Pending) or
    application (ACCEPTED) before that spark-submit returns, reads the environment the submit
    gave the driver (``spark.kubernetes.driverEnv.*`` / ``spark.yarn.appMasterEnv.*``),
    claims a generation with its token, marks its pod Running (`pods`) or its application
    RUNNING (`rm`), heartbeats every 0.1 s and then: ``finish``es after a few heartbeats;
    answers a cancel addressed to it (``answer``); or runs on whatever it is sent (``ignore``),
    until the cluster kills it (its pod deleted, its application KILLED)."""

    def __init__(self, catalog: Catalog, calls: Path, *, behaviour: str, pods: Pods | None = None,
                 rm: ResourceManager | None = None, index: int = 0, pod: str = POD,
                 app: str = YARN_APP) -> None:
        self.catalog, self.calls, self.behaviour, self.index = catalog, calls, behaviour, index
        self.pods, self.rm, self.pod, self.app = pods, rm, pod, app
        self.generation: int | None = None
        self.ended = threading.Event()
        self.stop = threading.Event()
        self.fenced_at_end: bool | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        _expected(self.calls, self.index).touch()  # before the submit: it waits for the driver's creation
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    # the cluster's side
    def _set_cluster(self, state: str) -> None:
        if self.pods is not None:
            with self.pods.lock:
                if state == "gone":
                    self.pods.phases.pop((NAMESPACE, self.pod), None)
                else:
                    self.pods.phases[(NAMESPACE, self.pod)] = state
        if self.rm is not None:
            yarn = {"Pending": ("ACCEPTED", "UNDEFINED"), "Running": ("RUNNING", "UNDEFINED"),
                    "Succeeded": ("FINISHED", "SUCCEEDED"), "Failed": ("FINISHED", "FAILED")}[state]
            with self.rm.lock:
                self.rm.apps.setdefault(self.app, {}).update(state=yarn[0], finalStatus=yarn[1])

    def _killed(self) -> bool:
        if self.pods is not None:
            with self.pods.lock:
                return (NAMESPACE, self.pod) not in self.pods.phases
        assert self.rm is not None
        return (self.rm.app(self.app) or {}).get("state") == "KILLED"

    def _status(self, state: str, **fields: Any) -> None:
        assert self.generation is not None
        write_status(self.catalog, state, generation=self.generation, host=self.pod, pid=1,
                     application_id=self.app, **fields)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        finally:
            self.ended.set()

    def _serve(self) -> None:
        deadline = time.monotonic() + 120  # the operator builds and submits first: slow on a loaded machine
        while len(submitted(self.calls)) <= self.index:
            if self.stop.wait(0.05) or time.monotonic() > deadline:
                return
        self._set_cluster("Pending")
        _created(self.calls, self.index).touch()  # now its spark-submit returns
        conf = conf_of(submitted(self.calls)[self.index])
        env = {key.split(".")[-1]: value for key, value in conf.items()
               if key.startswith(("spark.kubernetes.driverEnv.", "spark.yarn.appMasterEnv."))}
        self._set_cluster("Running")
        claim = self.catalog.claim_generation({**generation_details(environ=env),
                                               "submitter": env.get("SPARKPOINT_SUBMITTER"), "app": self.app})
        self.generation = claim.generation
        channel = ControlChannel(self.catalog)
        fence = Fence(self.catalog, self.generation)
        beats = 0
        while not self.stop.wait(0.1):
            if self._killed():
                return  # the cluster killed it: no end recorded
            try:
                fence.check()
            except Exception:  # noqa: BLE001 - StaleGeneration: a later claim fenced it
                self.fenced_at_end = True
                self._status("failed", error=f"generation {self.generation} superseded")
                self._set_cluster("Failed")
                return
            self._status("running")
            beats += 1
            if self.behaviour == "finish" and beats >= 3:
                self._status("finished")
                write_run_result(self.catalog, RunResult(status="finished", job=self.catalog.job,
                                                         generation=self.generation, batches_processed=2))
                self._set_cluster("Succeeded")
                return
            if self.behaviour == "answer":
                for request in channel.pending(self.generation):
                    if request.kind == "cancel":
                        channel.acknowledge(request, self.generation)
                        self._status("stopped")
                        channel.complete(request, generation=self.generation)
                        write_run_result(self.catalog, RunResult(status="stopped", job=self.catalog.job,
                                                                 generation=self.generation))
                        self._set_cluster("Succeeded")
                        return


def wait_until(condition: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    """`condition`'s first true value, looked at every 0.05 s; bounded for a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def env_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
