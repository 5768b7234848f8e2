"""on_kill: a clean stop-with-savepoint request first, the Spark hook's kill only as a fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


class FakeProcess:
    """spark-submit's Popen: exits once the job has seen a stop request (or never)."""

    def __init__(self, catalog: Catalog, obeys: bool) -> None:
        self.catalog = catalog
        self.obeys = obeys

    def poll(self) -> int | None:
        if self.obeys and ControlChannel(self.catalog).pending():
            return 0
        return None


class FakeHook:
    def __init__(self, process: FakeProcess) -> None:
        self._submit_sp = process


def make_operator(root: Path) -> Any:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="t", application="job.py", job_name="orders",
                                    checkpoint_dir=str(root), stop_timeout=3)


@pytest.mark.parametrize("obeys", [True, False])
def test_on_kill_asks_for_a_clean_stop_before_killing(tmp_path, monkeypatch, obeys):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    killed: list[bool] = []
    monkeypatch.setattr(SparkSubmitOperator, "on_kill", lambda self: killed.append(True))
    catalog = Catalog.open(str(tmp_path), "orders")
    operator = make_operator(tmp_path)
    operator._hook = FakeHook(FakeProcess(catalog, obeys))
    operator.on_kill()
    requests = [i.key for i in catalog.store.list("control") if i.key.endswith(".request.json")]
    assert len(requests) == 1, "a stop-with-savepoint request was sent"
    assert b'"stop"' in catalog.store.get(requests[0])
    assert killed == ([] if obeys else [True])
