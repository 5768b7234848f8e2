"""A real driver under the Airflow supervisor's kill (issue #19): SIGTERM to the whole
process group of a client-mode ``spark-submit`` (the JVM and the Python driver), SIGKILL
5 seconds later if anything is left.

The driver is caught with a batch's output staged but not yet recorded (a pause point
of the Delta sink, ``staged``). The test proves that the driver recorded its
generation as failed ("terminated by SIGTERM") before the SIGKILL deadline, never
recorded the staged batch, and that the next run resumes from the last checkpoint and
produces exactly the expected totals, each batch committed once, no staged file left.

Two ``spark-submit`` runs (about a minute).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.run_result import parse_result_line
from airflow_sparkpoint.demo.support import (
    delta_commits,
    orphaned_staged_files,
    write_batch_file,
)
from airflow_sparkpoint.storage import open_storage
from tests.support.background_totals import JOB, expected, rows, submit, table, tail
from tests.support.waits import wait_for

# slow: tests/e2e/test_e2e_kills.py's task marked failed (real supervisor SIGTERM to the
# process group) is the default run's version; `make test-all` runs this one
pytestmark = [pytest.mark.spark, pytest.mark.slow]

SUPERVISOR_ESCALATION_S = 5.0  # airflow/sdk/execution_time/supervisor.py: kill(..., escalation_delay=5.0)


def test_sigterm_to_the_process_group_records_failed_and_the_next_run_resumes_exactly(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "sp")), JOB)
    pauses = tmp_path / "pauses"
    for index in range(2):
        write_batch_file(tmp_path / "input", index, rows(index))
    log = tmp_path / "first.log"
    proc = submit(tmp_path, {"spark.sparkpoint.trigger": "processingTime:1 second",
                             "spark.sparkpoint.control.pollInterval": "500 milliseconds",
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

        # What the task supervisor does: SIGTERM to the group, SIGKILL 5 s later.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=SUPERVISOR_ESCALATION_S)
            ended_by = "itself"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            ended_by = "SIGKILL"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    status = catalog.read_status() or {}
    assert (status.get("generation"), status.get("state")) == (generation, "failed"), \
        (ended_by, status, tail(log))
    assert "terminated by SIGTERM" in (status.get("error") or ""), status
    assert (2, generation) not in catalog.transaction_keys(), "a batch was recorded after SIGTERM"
    latest = catalog.latest()
    assert latest is not None and latest.batch_id == 1, "no checkpoint after SIGTERM"
    assert table(tmp_path / "out") == expected(2), "only checkpointed batches are visible"

    # The next run (a retry) resumes from the last checkpoint; batch 2 runs again, once.
    write_batch_file(tmp_path / "input", 3, rows(3))
    log2 = tmp_path / "retry.log"
    retry = submit(tmp_path, {"spark.sparkpoint.trigger": "availableNow"}, log2)
    assert retry.wait(timeout=600) == 0, tail(log2)
    parsed = parse_result_line(log2.read_text())
    assert parsed is not None, tail(log2)
    result = parsed.to_json()
    assert result["status"] == "finished" and result["generation"] == generation + 1
    assert result["first_batch"] == 2 and result["last_batch"] == 3
    assert table(tmp_path / "out") == expected(4)
    commits = delta_commits(tmp_path / "out")
    assert [c["batch"] for c in commits] == [0, 1, 2, 3], commits
    assert orphaned_staged_files(tmp_path / "out", JOB) == []
    assert catalog.transactions() == []
