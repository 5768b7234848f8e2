"""``checkpoint.interval=0`` is a retained checkpoint of every batch, also when the
coordinator falls behind Spark (the flaky ``_first_run`` of test_lineages.py: under load it
retained ``[7, 5, 4]``, batch 6 had no checkpoint).

The coordinator is held right after the checkpoint of batch 1 (``after_metadata``) while
Spark goes on and commits every other batch; released, it finds their progress events
queued (and the query's end, whose own events may still be on the listener bus). Every
batch must have its checkpoint, and every row must be in the table exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from tests.support.race_drivers import (
    JOB,
    TIMEOUT_S,
    args,
    diff,
    expected_rows,
    job_conf,
    table_rows,
    write_inputs,
)
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

BATCHES = 6


def test_a_coordinator_behind_spark_still_checkpoints_every_batch(tmp_path: Path, start_driver: Any) -> None:
    root = tmp_path / "checkpoints"
    write_inputs(tmp_path / "input", files=BATCHES)
    driver = start_driver("behind", job_conf(root, {"checkpoint.numRetained": "20"}), args(tmp_path),
                          pause="after_metadata:1")
    assert driver.reached("after_metadata")["batch"] == 1
    catalog = Catalog.open(str(root), JOB)
    live = Path((catalog.read_status() or {})["live_dir"])
    wait_for("Spark to commit the last batch", (live / "commits" / str(BATCHES - 1)).exists, TIMEOUT_S,
             driver.tail, proc=driver.proc)
    assert [m.batch_id for m in catalog.checkpoints()] == [1, 0], \
        "the coordinator was held while Spark went on"

    driver.release("after_metadata")
    assert driver.wait() == 0, driver.tail()

    assert [m.batch_id for m in catalog.checkpoints()] == list(range(BATCHES - 1, -1, -1)), driver.tail()
    problems = diff(expected_rows(tmp_path / "input"), table_rows(tmp_path / "table"))
    assert not problems, problems
