"""The driver's own error is the submit task's error (issue #48), through real
``spark-submit``: a restore of a savepoint that does not exist is refused by the driver
before it claims a generation (no status record is written), so only its output says
why. The task's exception starts with ``job '<name>' failed: RestoreError: ...`` naming
the path, the Spark provider's ``Cannot execute: ... Error code is: 1`` is its cause, and
nothing was written to the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.inputs import write_event_files
from tests.support.paths import REPO
from tests.support.task_instances import FakeTI

pytestmark = [pytest.mark.airflow, pytest.mark.spark]



def test_a_restore_the_driver_refuses_is_the_tasks_error(airflow_home: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator
    from airflow_sparkpoint.operators.driver_errors import SparkpointRunFailed
    from airflow_sparkpoint.storage import open_storage

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    root = tmp_path / "checkpoints"
    write_event_files(tmp_path / "input", files=1, users=2)
    missing = f"{root}/orders/savepoints/savepoint-9-0123abcd"
    op = SparkpointSubmitOperator(
        task_id="orders", application=str(REPO / "dags" / "jobs" / "quickstart_totals.py"), job_name="orders",
        checkpoint_dir=str(root), restore=missing,
        application_args=["--input", str(tmp_path / "input"), "--output", str(tmp_path / "output")],
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN"},
    )
    context: Any = {"ti": FakeTI()}
    with pytest.raises(SparkpointRunFailed) as info:
        op.execute(context)

    message = str(info.value)
    first, pointer = message.splitlines()[:2]
    assert first.startswith("job 'orders' failed: RestoreError: ") and missing in first, message
    assert pointer.startswith("(spark-submit exited with code 1;"), message
    assert "Cannot execute" in str(info.value.__cause__) and "Error code is: 1" in str(info.value.__cause__)
    assert "Cannot execute" not in message, "the provider's message is the cause, not the task's error"
    # refused before the claim: the store holds nothing of the job
    assert list(open_storage(str(root)).list("orders/generations")) == []
