"""A real Airflow 3 on loopback, the way a user runs it on one machine: ``airflow
api-server``, ``scheduler`` (LocalExecutor), ``dag-processor`` and ``triggerer`` as four
separate processes on a throwaway AIRFLOW_HOME with SQLite, SimpleAuthManager auth.

`AirflowStack` starts and stops it; `AirflowApi` is a small client of the public REST API
(``/api/v2``) with the token from ``POST /auth/token`` (the generated password file of
SimpleAuthManager under AIRFLOW_HOME): trigger runs, wait for task states, read tries,
XComs and logs, mark a task instance failed, clear it.

Every process the stack starts (and every process they start: task supervisors, tasks,
``spark-submit``, drivers, Python workers) carries ``SPARKPOINT_E2E_STACK=<token>`` in its
environment; teardown SIGKILLs every process that has it, so nothing outlives a session,
not even an orphaned driver.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.procs import kill_marked, wait_gone
from tests.support.servers import free_port
from tests.support.waits import wait_for

VENV_BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}


class StackError(RuntimeError):
    """The stack did not start, or a wait ran out (the message has what was seen)."""


@dataclass
class AirflowStack:
    """Four Airflow processes on a throwaway home. `start` returns when the API answers
    and the scheduler, dag-processor and triggerer report healthy heartbeats."""

    home: Path
    bundles: Mapping[str, Path]
    extra_env: Mapping[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_in: float = 0.0
    #: the log of each component's current process (a restart starts a new file)
    log_paths: dict[str, Path] = field(default_factory=dict)
    _restarts: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def logs(self) -> Path:
        return self.home / "process-logs"

    def env(self) -> dict[str, str]:
        """The environment of every Airflow process: nothing of the test process's own
        Airflow settings (a session may have set AIRFLOW_HOME for `dag.test()` tests)."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW", "SPARKPOINT_TEST", "PYTEST"))}
        bundles = [
            {"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
             "kwargs": {"path": str(path), "refresh_interval": 2}}
            for name, path in self.bundles.items()
        ]
        secret = "e2e-" + self.token
        return {
            **base,
            "PATH": f"{VENV_BIN}{os.pathsep}{base.get('PATH', os.defpath)}",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARKPOINT_E2E_STACK": self.token,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(next(iter(self.bundles.values()))),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": secret,
            "AIRFLOW__API_AUTH__JWT_SECRET": secret,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "600",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            **self.extra_env,
        }

    def _airflow(self, *args: str) -> list[str]:
        return [str(VENV_BIN / "airflow"), *args]

    def start(self, timeout: float = 300) -> None:
        """Migrate the database, start the four processes and wait until healthy.

        :raises StackError: a process exited or the stack was not healthy in `timeout` s.
        """
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.port = self.port or free_port()
        with open(self.logs / "db-migrate.log", "wb") as out:
            done = subprocess.run(self._airflow("db", "migrate"), check=False, env=self.env(), stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        if done.returncode:
            raise StackError(f"airflow db migrate failed ({done.returncode}):\n{self.tail('db-migrate')}")
        for name in COMPONENTS:
            self.start_component(name)
        self.wait_healthy(timeout=max(30.0, timeout - (time.monotonic() - started)))
        self.started_in = time.monotonic() - started

    def start_component(self, name: str) -> None:
        args = {"api-server": ("api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers",
                               "1"),
                "scheduler": ("scheduler",), "dag-processor": ("dag-processor",),
                "triggerer": ("triggerer",)}[name]
        restarts = self._restarts.get(name, 0)
        self.log_paths[name] = (self.logs
                                / (f"{name}.log" if not restarts else f"{name}-restart{restarts}.log"))
        with open(self.log_paths[name], "ab") as out:
            # Its own session: a Ctrl-C of pytest does not reach it; teardown kills it.
            self.procs[name] = subprocess.Popen(self._airflow(*args), env=self.env(), stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def stop_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        """Stop one component (its whole process group), waiting for it to exit."""
        proc = self.procs[name]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def restart_component(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Kill a component (SIGKILL by default: a crash) and start it again; returns the
        old pid."""
        old = self.procs[name].pid
        self.stop_component(name, sig)
        self._restarts[name] = self._restarts.get(name, 0) + 1
        self.start_component(name)
        return old

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def wait_healthy(self, timeout: float = 180, components: Iterable[str] = ("scheduler", "triggerer",
                                                                                 "dag_processor")) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                last = self.health()
                if last.get("metadatabase", {}).get("status") == "healthy" and all(
                    (last.get(c) or {}).get("status") == "healthy" for c in components
                ):
                    return
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.5)
        raise StackError(f"Airflow not healthy after {timeout:g} s: {last}\n{self.tails()}")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(f"airflow {name} exited with {proc.returncode}:\n{self.tail(name)}")

    def password(self) -> str:
        """The admin password SimpleAuthManager generated at the API server's start."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        return str(json.loads(path.read_text())["admin"])

    def api(self) -> AirflowApi:
        return AirflowApi(self.url, "admin", self.password())

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_paths.get(name, self.logs / f"{name}.log")
        if not path.exists():
            return f"({name}: no log)"
        return f"--- {name}.log\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def tails(self) -> str:
        return "\n".join(self.tail(name) for name in COMPONENTS)

    def stop(self) -> None:
        """SIGTERM the components, then SIGKILL everything that carries the stack's token."""
        for name in COMPONENTS:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        wait_gone(kill_marked("SPARKPOINT_E2E_STACK", self.token), timeout=30)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    def keep_logs(self, target: Path) -> Path:
        """Copy the process logs and task logs to `target` (a test artifact)."""
        target.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.logs, target / "process-logs", dirs_exist_ok=True)
        if (self.home / "logs").exists():
            shutil.copytree(self.home / "logs", target / "task-logs", dirs_exist_ok=True)
        return target


class AirflowApi:
    """The public REST API of the stack, authenticated like a user (a JWT from
    ``POST /auth/token``)."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url
        response = httpx.post(f"{url}/auth/token", json={"username": username, "password": password},
                              timeout=30)
        if response.status_code >= 300:
            raise StackError(f"POST /auth/token: {response.status_code} {response.text}")
        self._client = httpx.Client(base_url=f"{url}/api/v2", timeout=60,
                                    headers={"Authorization": f"Bearer {response.json()['access_token']}"})

    def close(self) -> None:
        self._client.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._client.request(method, path, **kwargs)
        if response.status_code >= 300:
            raise StackError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    # ------------------------------------------------------------------ DAGs and runs

    def wait_dag(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        """Wait until the dag-processor has serialized `dag_id`; return the DAG."""
        return wait_for(f"DAG {dag_id} to be parsed", lambda: self._dag_or_none(dag_id), timeout,
                        interval=0.5, error=StackError)

    def _dag_or_none(self, dag_id: str) -> dict[str, Any] | None:
        response = self._client.get(f"/dags/{dag_id}")
        return dict(response.json()) if response.status_code == 200 else None

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None) -> str:
        """Trigger a run of `dag_id` (parsed and unpaused first); returns its run id."""
        self.wait_dag(dag_id)
        self.unpause(dag_id)
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.request("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}"))

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        """Wait for the run to end; returns its state (success / failed)."""
        def done() -> str | None:
            state = self.run(dag_id, run_id)["state"]
            return state if state in ("success", "failed") else None

        return wait_for(f"run {dag_id}/{run_id} to end", done, timeout, lambda: self.describe(dag_id, run_id),
                        interval=0.5, error=StackError)

    # ------------------------------------------------------------------ task instances

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}

    def wait_task(self, dag_id: str, run_id: str, task_id: str, states: Iterable[str],
                  timeout: float = 600, try_number: int | None = None) -> dict[str, Any]:
        """Wait until the task instance is in one of `states` (and at `try_number`, if
        given); returns it.

        :raises StackError: it reached another terminal state first, or the timeout.
        """
        wanted = set(states)

        def check() -> dict[str, Any] | None:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti["state"] in wanted and (try_number is None or ti["try_number"] == try_number):
                return ti
            if ti["state"] in TERMINAL - wanted and (try_number is None or ti["try_number"] >= try_number):
                raise StackError(f"{dag_id}/{run_id}/{task_id} is {ti['state']} (try {ti['try_number']}), "
                                 f"expected {sorted(wanted)}:\n{self.describe(dag_id, run_id)}")
            return None

        return wait_for(f"{task_id} to be {sorted(wanted)}", check, timeout,
                        lambda: self.describe(dag_id, run_id), interval=0.5, error=StackError)

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of a task instance, oldest first (``try_number``, ``state``, ``pid``...)."""
        body = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
        return sorted(body["task_instances"], key=lambda t: t["try_number"])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """The XCom value (deserialized), or None when there is none."""
        response = self._client.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                                    f"/xcomEntries/{key}",
                                    params={"deserialize": True, "stringify": False})
        if response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise StackError(f"xcom {task_id}/{key}: {response.status_code} {response.text}")
        return response.json()["value"]

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The task log of one try, as text."""
        body = self.request("GET",
                            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                            params={"full_content": True})
        lines = []
        for entry in body.get("content") or []:
            if isinstance(entry, dict):
                extra = {k: v for k, v in entry.items() if k not in _LOG_FIELDS}
                lines.append(f"{entry.get('level', '')} {entry.get('event', '')}"
                             + (f" {extra}" if extra else ""))
            else:
                lines.append(str(entry))
        return "\n".join(lines)

    def mark(self, dag_id: str, run_id: str, task_id: str, state: str) -> list[dict[str, Any]]:
        """Set a task instance's state (e.g. ``failed``), as the UI's "Mark as" does."""
        body = self.request("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
                            json={"new_state": state})
        return list(body["task_instances"])

    def mark_run(self, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
        """Set a DAG run's state (e.g. ``failed``), as the UI's "Mark run as" does."""
        return dict(self.request("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": state}))

    def clear(self, dag_id: str, run_id: str, task_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Clear task instances of one run (running ones are restarted), as the UI's Clear."""
        body = self.request("POST", f"/dags/{dag_id}/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": run_id, "task_ids": list(task_ids), "only_failed": False,
            "only_running": False, "reset_dag_runs": True, "include_downstream": False,
            "include_upstream": False})
        return list(body["task_instances"])

    def create_connection(self, conn_id: str, conn_type: str, **fields: Any) -> None:
        """Create (or replace) a connection in the metadata database."""
        self._client.delete(f"/connections/{conn_id}")
        self.request("POST", "/connections",
                     json={"connection_id": conn_id, "conn_type": conn_type, **fields})

    def describe(self, dag_id: str, run_id: str) -> str:
        """The run's task states and the tail of every try's log (for failure messages)."""
        try:
            tis = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        except StackError as exc:
            return f"(could not read the run: {exc})"
        lines = [f"run {dag_id}/{run_id}: " + ", ".join(f"{t['task_id']}={t['state']}" for t in tis)]
        for ti in tis:
            for number in range(1, int(ti.get("try_number") or 0) + 1):
                try:
                    text = self.log(dag_id, run_id, ti["task_id"], number)
                except StackError as exc:
                    text = str(exc)
                lines.append(f"--- {ti['task_id']} try {number}\n" + "\n".join(text.splitlines()[-25:]))
        return "\n".join(lines)


_LOG_FIELDS = {"event", "timestamp", "level", "logger", "ti_id", "task_id", "map_index", "run_id",
               "try_number", "dag_id", "filename", "lineno"}
