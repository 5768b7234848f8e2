"""Validate before completing, issue #15 hole 4: one missing shared file must not wedge
the job.

A running job (in this test's SparkSession) has checkpointed batches 0 and 1. One shared
file its live index references (the query's ``metadata``, referenced by every checkpoint)
is deleted from the store. The next checkpoint must notice and copy it again, so that it
is valid; after the live location is lost, a restart restores that checkpoint and the
output is exact. Without the check every later checkpoint references the missing file
and is invalid, and a restart finds nothing to restore.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.support.race_drivers import delta_version, diff, expected_rows, table_rows, write_inputs
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

JOB = "wedge"


def _job(spark: Any, root: Path, inputs: Path, trigger: str) -> tuple[Any, Any]:
    from airflow_sparkpoint.runtime import SparkpointJob

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.trigger": trigger, "spark.sparkpoint.control.pollInterval": "300ms",
    }, argv=[])
    events = spark.readStream.schema("id long, user string, amount long").option("maxFilesPerTrigger", 1) \
        .json(str(inputs))
    return job, events.dropDuplicates(["id"])


def test_a_deleted_shared_file_is_copied_again_by_the_next_checkpoint(spark: Any, tmp_path: Path) -> None:
    from airflow_sparkpoint.sinks import DeltaSink

    root, inputs, table = tmp_path / "root", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=2)
    catalog = Catalog.open(str(root), JOB)
    job, query = _job(spark, root, inputs, "processingTime:500ms")
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = job.run(query, sink=DeltaSink(str(table), mode="append"),
                                        output_mode="append")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        wait_for("batch 1 checkpointed and committed",
                 lambda: (delta_version(table, JOB) == 1 and (catalog.latest() or None)
                          and catalog.latest().batch_id == 1),
                 300)
        latest = catalog.latest()
        victim = next(ref.key for ref in latest.files if ref.path == "metadata")
        catalog.store.delete([victim])
        assert catalog.latest() is None, "every checkpoint references the deleted file"

        write_inputs(inputs, files=1, start=2)
        wait_for("a valid checkpoint of batch 2",
                 lambda: (catalog.latest() or None) and catalog.latest().batch_id == 2,
                 180)
        assert catalog.store.exists(victim), "the next checkpoint copied the missing file again"
        assert all(e.valid for e in catalog.list_checkpoints() if e.id >= catalog.latest().id)
        newest = catalog.latest()
    finally:
        channel = ControlChannel(catalog)
        channel.wait(channel.submit("cancel", generation=catalog.current_generation(), timeout_s=120).id,
                     timeout_s=120, poll_s=0.3)
        thread.join(120)
    assert "error" not in outcome, outcome
    assert outcome["result"].status == "stopped"

    shutil.rmtree(root / JOB / "live")  # the live location is gone: restore from the store
    write_inputs(inputs, files=1, start=3)
    job, query = _job(spark, root, inputs, "availableNow")
    result = job.run(query, sink=DeltaSink(str(table), mode="append"), output_mode="append")
    assert result.restored_from == catalog.checkpoint_uri(newest.id) and result.restore_mode == "snapshot"
    assert result.first_batch == newest.batch_id + 1
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, problems
