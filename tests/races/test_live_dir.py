"""A live directory is never shared (invariant 8), issue #15 hole 1.

Driver A (``processingTime``) has checkpointed and committed batches 0..3; its live
directory is exactly at its latest checkpoint. New input arrives and A is held inside
``foreachBatch`` of batch 4 (alive, its offsets for batch 4 written). Driver B starts with
default settings. B must not resume in A's directory (A may write it any moment): it
materializes a fresh one, hard-linking A's unchanged files, and runs batch 4 itself. Then
A goes on and must stop at its next checkpoint (`StaleGeneration`) without touching B's
output. Every row is checked against the input files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from tests.support.race_drivers import (
    JOB,
    TIMEOUT_S,
    args,
    delta_version,
    diff,
    expected_rows,
    job_conf,
    table_rows,
    write_inputs,
)
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]


def test_a_new_generation_never_resumes_in_the_directory_of_a_running_one(
    tmp_path: Path, start_driver: Any
) -> None:
    root, inputs, table = tmp_path / "checkpoints", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=4)
    catalog = Catalog.open(str(root), JOB)
    running = start_driver("A", job_conf(root, {"trigger": "processingTime:500ms"}), args(tmp_path),
                           pause="stage:4")
    wait_for("A to checkpoint and commit batch 3",
             lambda: (delta_version(table) == 3 and (catalog.latest() or None)
                      and catalog.latest().batch_id == 3),
             TIMEOUT_S, running.tail, proc=running.proc)
    a_live = (catalog.read_status() or {}).get("live_dir")
    assert a_live and os.path.isdir(a_live)

    write_inputs(inputs, files=1, start=4)
    assert running.reached("stage")["batch"] == 4
    assert running.proc.poll() is None, "A is alive"

    newer = start_driver("B", job_conf(root), args(tmp_path))
    assert newer.wait() == 0, newer.tail()
    result = newer.result
    assert result is not None
    assert result["restore_mode"] != "in-place", "B resumed in the directory of a running generation"
    assert os.path.realpath(result["live_dir"]) != os.path.realpath(a_live)
    reuse = result["live_reuse"]
    # unchanged files linked, not copied
    assert reuse["mode"] == "materialized" and reuse["linked"] > 0, reuse
    assert result["first_batch"] == 4 and result["last_batch"] == 4
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, f"after B: {problems}"

    running.release("stage")
    assert running.wait() != 0, "the superseded generation must stop"
    assert "StaleGeneration" in running.output, running.tail()
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, problems
    assert {(r.batch_id, r.generation) for r in catalog.transactions()} <= {(4, 1)}, \
        "only A's staged batch is left"
