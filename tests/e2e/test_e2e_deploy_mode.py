"""Cluster deploy mode under a real Airflow, against a fake cluster manager at the edge.

Python applications cannot use cluster deploy mode on Spark standalone, and no YARN or
Kubernetes runs here, so the cluster manager is faked at its edge only: a
``spark2-submit`` (``tests/e2e/fakes``) that "submits" a driver and answers ``--status``
and ``--kill`` like a standalone master, plus the master's REST status endpoint served
from this test. Everything else is real: the api-server, scheduler and task supervisor,
the Spark provider's cluster-mode path (durable reconnect, driver-status tracking) and
`SparkpointSubmitOperator`.

Spark standalone's cluster mode does not run Python applications: the provider refuses
it with a clear error before anything is submitted (cluster mode runs on Kubernetes and
YARN only, tests/unit/airflow/test_submit_cluster.py); this test shows that it does,
through the real stack.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import Totals

pytestmark = [pytest.mark.airflow]

DRIVER = "driver-20260101000000-0000"


class _Status(BaseHTTPRequestHandler):
    """``GET /v1/submissions/status/<id>`` of a standalone master's REST server."""

    def do_GET(self) -> None:
        # Pretty-printed like the master's (the provider's curl path parses `"key" : value` lines).
        body = json.dumps({"action": "SubmissionStatusResponse", "driverState": "FINISHED",
                           "serverSparkVersion": "4.2.0", "submissionId": self.path.rsplit("/", 1)[-1],
                           "success": True}, indent=2, separators=(",", " : ")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def fake_master_rest() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_cluster_deploy_mode_is_refused_before_anything_is_submitted(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "cluster_mode")
    pipeline.write_many(1)
    invocations = airflow_stack.home / "e2e-logs" / "fake-cluster" / "invocations.txt"
    with fake_master_rest() as rest_port:
        airflow_api.create_connection(
            "spark_fake_cluster", "spark", host="spark://127.0.0.1", port=7077,
            extra=json.dumps({"deploy-mode": "cluster", "spark-binary": "spark2-submit",
                              "rest-port": rest_port}))
        run = airflow_api.trigger("e2e_cluster_mode", pipeline.params())
        state = airflow_api.wait_run("e2e_cluster_mode", run, timeout=600)

    submitted = [line for line in (invocations.read_text().splitlines() if invocations.exists() else [])
                 if pipeline.job in line]
    log = airflow_api.log("e2e_cluster_mode", run, "job", 1)
    assert state == "failed", (
        f"cluster deploy mode was not refused: the run ended {state} with XCom "
        f"{airflow_api.xcom('e2e_cluster_mode', run, 'job')!r} after submitting {submitted}")
    assert submitted == [], f"cluster mode reached the cluster manager: {submitted}"
    assert "ConfigError" in log and "deploy_mode='cluster'" in log, log[-3000:]
    assert pipeline.catalog.current_generation() == 0, "a generation was claimed"
