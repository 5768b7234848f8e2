"""The stack of the UI tests (tests/ui, fixture ``ui_stack``): one real Airflow API server
with the Sparkpoint plugin, and real pipeline history, for the UI tests (security, JSON,
metrics, browser).

- ``airflow api-server`` in its own process on 127.0.0.1 and a free port, SQLite metadata
  database, the SimpleAuthManager with a per-DAG denial list (`acl_auth_manager`), users
  admin / op / viewer;
- connections (environment variables) with secrets planted in login, password and extra:
  ``sp_local`` serves ``ui_totals`` (used by DAG ``open_dag``), ``lonely`` (no DAG declared),
  ``hidden`` (used by ``secret_dag``, denied to non-admins) and ``ghost`` (declared for
  ``ghost_dag``, which Airflow does not know); ``sp_s3`` serves ``s3_job`` on a moto S3
  endpoint; ``sp_trap`` serves ``trapped`` (used by ``secret_dag``) on an S3 endpoint that
  records every request (`RequestTrap`) and answers each with 403; ``sp_plain`` declares no
  job (as the tutorial's connection) and its root holds ``plain_job``;
- the DAGs ``open_dag`` and ``secret_dag`` in the DAGs folder, serialized into the metadata
  database (`airflow dags reserialize`): Airflow knows them;
- history from two real ``spark-submit`` runs of ``dags/jobs/quickstart_totals.py`` (the
  second restores the first's latest checkpoint) and a savepoint taken with the CLI;
- forged generation records, as anyone who can write to the store can write them: ``lonely``
  and ``hidden`` each claim to have been started by a task of ``open_dag`` (which a viewer
  may read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.paths import REPO
from tests.support.records import put_checkpoint
from tests.support.servers import free_port

SECRETS = ("AKIAPLANTEDLOGIN7", "planted-password-9f3c2b", "planted-extra-token-51d7",
           "planted-s3-secret-0a8e")
USERS = {"admin": "admin-pw-1", "op": "op-pw-2", "viewer": "viewer-pw-3"}
SPARKPOINT = Path(sys.executable).parent / "sparkpoint"
#: the DAG named by the forged generation records (readable by a viewer)
FORGED_DAG = "open_dag"


class RequestTrap:
    """An S3 endpoint on 127.0.0.1 that records the path of every request it gets and
    denies it (403 AccessDenied, which botocore does not retry)."""

    _DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
               b"<Message>Access Denied</Message></Error>")

    def __init__(self) -> None:
        self.requests: list[str] = []
        trap = self

        class Handler(BaseHTTPRequestHandler):
            def _deny(self) -> None:
                trap.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(trap._DENIED)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(trap._DENIED)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _deny

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="ui-request-trap",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=30)

@dataclass
class Stack:
    url: str
    home: Path
    root: Path  # the local storage root of sp_local
    env: dict[str, str]
    log: Path
    trap: RequestTrap

    def token(self, user: str) -> str:
        import httpx

        response = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": USERS[user]},
                              timeout=60)
        response.raise_for_status()
        return str(response.json()["access_token"])

    def cli_json(self, *args: str) -> dict[str, object]:
        out = subprocess.run([str(SPARKPOINT), *args, "--json"], check=True, capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
                             timeout=120)
        return dict(json.loads(out.stdout))


def _quickstart_history(base: Path) -> None:
    """Two real spark-submit runs (the second restores the first's latest checkpoint) and
    a savepoint made by the CLI from the latest checkpoint."""
    from airflow_sparkpoint.demo.support import SubmittedJob, write_batch_file

    job = SubmittedJob(base, REPO / "dags" / "jobs" / "quickstart_totals.py", "ui_totals", "availableNow", [])
    job.root.mkdir(parents=True, exist_ok=True)
    for run, files in enumerate(((0, 1), (2, 3))):
        for index in files:
            write_batch_file(job.input, index,
                             [{"user": f"u{u}", "amount": index * 10 + u} for u in range(3)])
        job.start()
        code = job.wait_exit(timeout=600)
        assert code == 0, f"run {run} of ui_totals exited with {code}:\n{job.tail()}"
    subprocess.run([str(SPARKPOINT), "savepoint", "--dir", str(job.root), "--job", "ui_totals"], check=True,
                   capture_output=True, timeout=120)


def _forged_generations(root: Path) -> None:
    """Generation records that claim a start by a task of `FORGED_DAG`: what a driver, or
    anyone who may write to the store, can put there."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.storage import open_storage

    for job in ("lonely", "hidden", "ghost"):
        Catalog(open_storage(str(root)), job).claim_generation(
            {"airflow": {"dag_id": FORGED_DAG, "task_id": "forged", "run_id": "forged", "try_number": "1"}})


#: the DAGs Airflow knows in the UI tests (the ids the connections declare, but ghost_dag)
UI_DAGS = """from datetime import datetime

from airflow.sdk import DAG

for dag_id in ("open_dag", "secret_dag"):
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
        pass
"""


def _plain_job(root: Path) -> None:
    """A job no connection declares: a claimed generation under `root` (``sp_plain``'s), and
    a directory that is no job's (a name a job cannot have)."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.storage import open_storage

    Catalog(open_storage(str(root)), "plain_job").claim_generation({"plan": "empty state"})
    (root / "not a job").mkdir()


def _s3_history(endpoint: str, bucket: str) -> None:
    """A pipeline on S3: a claimed generation and two checkpoints written through the catalog."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.storage import open_storage

    catalog = Catalog(open_storage(f"s3://{bucket}/sp", endpoint_url=endpoint, region_name="us-east-1"),
                      "s3_job")
    catalog.claim_generation({"plan": "empty state (no completed checkpoint yet)"})
    for batch in range(2):
        put_checkpoint(catalog, {f"state/0/0/{batch + 1}.delta": f"state {batch}".encode()}, batch_id=batch,
                       generation=1)


def start_ui_stack(base: Path, s3_server_process: str) -> Iterator[Stack]:
    """Start the stack under `base` with its S3 pipeline on the moto endpoint
    `s3_server_process`; yields it, and stops its servers when resumed.

    Raises RuntimeError with the server's log when the API server does not start."""
    import boto3
    import httpx

    home = base / "airflow-home"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "ui_dags.py").write_text(UI_DAGS)
    plain = base / "plain"
    (home / "simple_auth_manager_passwords.json").write_text(json.dumps(USERS))
    root = base / "quickstart" / "checkpoints"
    bucket = f"ui-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_server_process, region_name="us-east-1").create_bucket(Bucket=bucket)
    local = {"conn_type": "sparkpoint", "host": f"file://{root}", "login": SECRETS[0], "password": SECRETS[1],
             "extra": {"jobs": {"ui_totals": {"dags": ["open_dag"]}, "lonely": {},
                                "hidden": {"dags": ["secret_dag"]}, "ghost": {"dags": ["ghost_dag"]}},
                       "api_token": SECRETS[2]}}
    s3 = {"conn_type": "sparkpoint", "host": f"s3://{bucket}/sp", "login": "testing", "password": SECRETS[3],
          "extra": {"jobs": ["s3_job"], "endpoint_url": s3_server_process, "region_name": "us-east-1"}}
    trap = RequestTrap()
    trapped = {"conn_type": "sparkpoint", "host": "s3://trap-bucket/sp", "login": "testing",
               "password": SECRETS[3],
               "extra": {"jobs": {"trapped": {"dags": ["secret_dag"]}}, "endpoint_url": trap.url,
                         "region_name": "us-east-1"}}
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARKPOINT_TEST"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.ui.acl_auth_manager.DagAclAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{u}" for u in USERS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "simple_auth_manager_passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SP_LOCAL": json.dumps(local),
        "AIRFLOW_CONN_SP_S3": json.dumps(s3),
        "AIRFLOW_CONN_SP_TRAP": json.dumps(trapped),
        "AIRFLOW_CONN_SP_PLAIN": json.dumps({"conn_type": "sparkpoint", "host": f"file://{plain}"}),
        "SPARKPOINT_TEST_DENIED_DAGS": "secret_dag",
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    airflow = str(Path(sys.executable).parent / "airflow")
    log = base / "api-server.log"
    started: list[subprocess.Popen[bytes]] = []

    def start_server() -> None:  # the metadata database, then the server: while Spark runs
        with open(log, "wb") as out:
            subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=out,
                           stderr=subprocess.STDOUT, timeout=900)
            subprocess.run([airflow, "dags", "reserialize"], env=env, check=True, stdout=out,
                           stderr=subprocess.STDOUT, timeout=900)
            started.append(subprocess.Popen([airflow, "api-server", "-H", "127.0.0.1", "-p", str(port), "-w",
                                             "1"],
                                            env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))

    starter = threading.Thread(target=start_server, name="ui-api-server")
    starter.start()
    try:
        _quickstart_history(base / "quickstart")
        _s3_history(s3_server_process, bucket)
        _forged_generations(root)
        _plain_job(plain)
        starter.join(timeout=900)
        if not started:
            raise RuntimeError(f"airflow db migrate failed:\n{log.read_text(errors='replace')[-4000:]}")
        server = started[0]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the API server did not start:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(1)
        yield Stack(url, home, root, env, log, trap)
    finally:
        trap.close()
        starter.join(timeout=900)
        for server in started:
            if server.poll() is None:
                os.killpg(server.pid, 15)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, 9)
                    server.wait()
