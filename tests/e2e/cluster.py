"""A Spark standalone cluster from the installed pyspark: one master and two workers
(``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker``)
on loopback, one core and 1 GiB each, so an application's executors are JVMs of their
own, talking to the driver over the network.

Every process carries ``SPARKPOINT_E2E_CLUSTER=<token>`` in its environment (executors
and their Python workers inherit it from the worker); `stop` SIGKILLs them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.procs import Proc, descendants, kill_marked, read, wait_gone
from tests.e2e.stack import StackError
from tests.support.servers import free_port
from tests.support.waits import wait_for

WORKER_MEMORY = "1g"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class SparkCluster:
    base: Path
    workers: int = 2
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = 0
    webui_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    worker_procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_in: float = 0.0

    @property
    def url(self) -> str:
        """The master URL applications connect to (``spark://127.0.0.1:<port>``)."""
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKPOINT_TEST", "PYTEST"))}
        return {
            **base,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', os.defpath)}",
            "SPARKPOINT_E2E_CLUSTER": self.token,
        }

    def _spark_class(self, *args: str, log: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen([*prefix, str(spark_home() / "bin" / "spark-class"), *args],
                                    env=self.env(),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 180) -> None:
        started = time.monotonic()
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.webui_port = self.webui_port or free_port()
        self.master = self._spark_class(
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.webui_port), log=self.base / "logs" / "master.log")
        for index in range(self.workers):
            self.start_worker(f"worker-{index}")
        self.wait_workers(self.workers, timeout)
        self.started_in = time.monotonic() - started

    def start_worker(self, name: str, prefix: Sequence[str] = ()) -> None:
        """Start worker `name`; `prefix` is a command that runs it (e.g. `mountns.private_tmp`)."""
        work = self.base / name
        work.mkdir(parents=True, exist_ok=True)
        self.worker_procs[name] = self._spark_class(
            "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--cores", "1",
            "--memory", WORKER_MEMORY, "--webui-port", str(free_port()), "--work-dir", str(work),
            log=self.base / "logs" / f"{name}.log", prefix=prefix)

    def state(self) -> dict[str, Any]:
        """The master's JSON status (``workers``, ``activeapps``, ``completedapps``...)."""
        response = httpx.get(f"http://127.0.0.1:{self.webui_port}/json/", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except httpx.HTTPError:
            return []

    def wait_workers(self, count: int, timeout: float = 180) -> None:
        wait_for(f"{count} Spark workers to be alive", lambda: len(self.alive_workers()) >= count, timeout,
                 lambda: "\n".join(self.tail(n) for n in ("master", *self.worker_procs)), proc=self.master,
                 interval=0.5, error=StackError)

    def worker_tree(self, name: str) -> list[Proc]:
        """The worker JVM and everything under it (executor JVMs, Python workers)."""
        proc = self.worker_procs[name]
        me = read(proc.pid)
        return ([me] if me else []) + descendants(proc.pid)

    def executors(self, name: str) -> list[Proc]:
        return [p for p in self.worker_tree(name) if "CoarseGrainedExecutorBackend" in p.cmdline]

    def kill_worker(self, name: str) -> list[Proc]:
        """SIGKILL a worker with its executors and their Python workers (a lost machine);
        returns the processes killed, once they are gone."""
        tree = self.worker_tree(name)
        os.killpg(self.worker_procs[name].pid, signal.SIGKILL)
        for proc in tree:  # an executor JVM is in the worker's group; be sure anyway
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.worker_procs[name].wait(timeout=30)
        left = wait_gone(tree, timeout=30)
        if left:
            raise StackError(f"worker {name}: processes survived SIGKILL: {left}")
        return tree

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.base / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return f"--- {name}.log\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        kill_marked("SPARKPOINT_E2E_CLUSTER", self.token)
        procs = [self.master, *self.worker_procs.values()]
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        wait_gone(kill_marked("SPARKPOINT_E2E_CLUSTER", self.token), timeout=30)
