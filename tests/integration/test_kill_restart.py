"""A checkpointed Delta merge job SIGKILLed and restarted (issue #29: the run every Spark
line of `make test-matrix` must pass): the whole process group of a client-mode
``spark-submit`` is killed while batch 2's output is staged but not recorded (the
Delta sink's ``staged`` pause point, in ``dags/jobs/quickstart_totals.py``); the restart resumes from
the last checkpoint and the table holds exactly the totals of the input, each batch
committed once, nothing left staged.

Two ``spark-submit`` runs (about a minute): ``slow``, run by ``make test-matrix`` and
``make test-all``; the SIGTERM variant (`test_driver_sigterm`) is in the default run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.run_result import parse_result_line
from airflow_sparkpoint.demo.support import delta_commits, orphaned_staged_files, write_batch_file
from airflow_sparkpoint.storage import open_storage
from tests.support.background_totals import JOB, expected, rows, submit, table, tail
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_sigkill_with_a_batch_staged_then_restart_is_exact(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "sp")), JOB)
    pauses = tmp_path / "pauses"
    for index in range(2):
        write_batch_file(tmp_path / "input", index, rows(index))
    log = tmp_path / "first.log"
    proc = submit(tmp_path, {"spark.sparkpoint.trigger": "processingTime:1 second",
                             "spark.sparkpoint.test.pauseAt": "staged:2",
                             "spark.sparkpoint.test.pauseDir": str(pauses)}, log)
    try:
        wait_for("batch 1 checkpointed",
                 lambda: (latest := catalog.latest()) is not None and latest.batch_id >= 1,
                 300, lambda: tail(log), proc=proc)
        write_batch_file(tmp_path / "input", 2, rows(2))
        reached = wait_for("batch 2 staged (pause point)",
                           lambda: (pauses / "staged.reached").exists(),
                           300, lambda: tail(log), proc=proc)
        assert reached, "the fault point was not reached"
        generation = catalog.current_generation()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, tail(log))
    assert (2, generation) not in catalog.transaction_keys(), "batch 2 was recorded before the kill"
    latest = catalog.latest()
    assert latest is not None and latest.batch_id == 1, latest
    assert table(tmp_path / "out") == expected(2), "only checkpointed batches are visible"

    write_batch_file(tmp_path / "input", 3, rows(3))
    log2 = tmp_path / "retry.log"
    retry = submit(tmp_path, {"spark.sparkpoint.trigger": "availableNow"}, log2)
    assert retry.wait(timeout=600) == 0, tail(log2)
    parsed = parse_result_line(log2.read_text())
    assert parsed is not None, tail(log2)
    result = parsed.to_json()
    assert result["status"] == "finished" and result["generation"] == generation + 1, result
    assert (result["first_batch"], result["last_batch"]) == (2, 3), result
    assert table(tmp_path / "out") == expected(4)
    assert [c["batch"] for c in delta_commits(tmp_path / "out")] == [0, 1, 2, 3]
    assert orphaned_staged_files(tmp_path / "out", JOB) == []
    assert catalog.transactions() == []
