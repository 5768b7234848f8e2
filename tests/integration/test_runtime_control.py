"""A long-running processingTime job serves a savepoint request while it keeps running,
then a stop-with-savepoint request; a new run restores from that savepoint with exact
output. Driven through the control channel, as the CLI and the operators do."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.support.inputs import delta_totals, expected_totals, write_event_files
from tests.support.waits import wait_for

pytestmark = pytest.mark.spark


def start_job(spark: Any, root: Path, inputs: Path, table: Path,
              **conf: str) -> tuple[threading.Thread, dict]:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "orders",
        "spark.sparkpoint.trigger": "processingTime:1s", "spark.sparkpoint.control.pollInterval": "300ms",
        **{f"spark.sparkpoint.{k}": v for k, v in conf.items()},
    }, argv=[])
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = job.run(totals, sink=DeltaSink(str(table), mode="merge", keys=["user"]),
                                        output_mode="update")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def test_savepoint_while_running_then_stop_with_savepoint_then_restore(spark, tmp_path):
    root, inputs, table = tmp_path / "root", tmp_path / "input", tmp_path / "table"
    rows = write_event_files(inputs, files=3, users=3)
    thread, outcome = start_job(spark, root, inputs, table)
    catalog = Catalog.open(str(root), "orders")
    channel = ControlChannel(catalog)
    wait_for("batch 2", lambda: (catalog.read_status() or {}).get("last_batch") == 2, 90)

    generation = int(catalog.read_status()["generation"])  # type: ignore[index]
    request = channel.submit("savepoint", generation=generation, timeout_s=60)
    result = channel.wait(request.id, timeout_s=60, poll_s=0.3)
    assert result.state == "completed" and result.savepoint
    assert thread.is_alive(), "a savepoint must not stop the job"
    running_savepoint = result.savepoint

    rows += write_event_files(inputs, files=2, users=3, start=3)
    wait_for("batch 4", lambda: (catalog.read_status() or {}).get("last_batch") == 4, 90)
    stop = channel.submit("stop", generation=generation, timeout_s=60)
    stopped = channel.wait(stop.id, timeout_s=60, poll_s=0.3)
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    run = outcome["result"]
    assert run.status == "stopped"
    assert run.savepoint == stopped.savepoint != running_savepoint
    assert stopped.batch_id == 4
    assert delta_totals(table) == expected_totals(rows), "pending commits are done before the stop"

    # The running savepoint is behind the table now: restoring it is refused (invariant 4).
    from airflow_sparkpoint.exceptions import SinkAheadError

    with pytest.raises(SinkAheadError, match="already committed batch 4"):
        _restore_and_finish(spark, root, inputs, table, running_savepoint)

    rows += write_event_files(inputs, files=2, users=3, start=5)
    result2 = _restore_and_finish(spark, root, inputs, table, run.savepoint)
    assert result2.status == "finished" and result2.first_batch == 5
    assert delta_totals(table) == expected_totals(rows)


def _restore_and_finish(spark: Any, root: Path, inputs: Path, table: Path, savepoint: str) -> Any:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "orders",
        "spark.sparkpoint.restore": savepoint, "spark.sparkpoint.trigger": "availableNow",
    }, argv=[])
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    return job.run(totals, sink=DeltaSink(str(table), mode="merge", keys=["user"]), output_mode="update")


def test_latest_resumes_in_place_and_losing_the_work_dir_loses_nothing(spark, tmp_path):
    import shutil

    root, inputs, table = tmp_path / "root", tmp_path / "input", tmp_path / "table"
    rows = write_event_files(inputs, files=2, users=2)
    first = _run_latest(spark, root, inputs, table)
    assert first.restore_mode == "empty" and first.last_batch == 1

    rows += write_event_files(inputs, files=2, users=2, start=2)
    second = _run_latest(spark, root, inputs, table)
    assert second.restore_mode == "in-place", "the live location matched the latest checkpoint"
    assert second.first_batch == 2
    assert delta_totals(table) == expected_totals(rows)

    shutil.rmtree(root / "orders" / "live")  # the fast local disk is gone
    rows += write_event_files(inputs, files=1, users=2, start=4)
    third = _run_latest(spark, root, inputs, table)
    assert third.restore_mode == "snapshot" and third.first_batch == 4
    assert delta_totals(table) == expected_totals(rows)
    catalog = Catalog.open(str(root), "orders")
    newest = catalog.latest()
    assert newest is not None and newest.batch_id == 4
    # Incremental: the files restored from the store are reused, not copied again.
    assert newest.stats.bytes_copied < newest.stats.bytes_total / 2


def _run_latest(spark: Any, root: Path, inputs: Path, table: Path) -> Any:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={"spark.sparkpoint.dir": str(root),
                                            "spark.sparkpoint.job": "orders"},
                                      argv=[])
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    return job.run(totals, sink=DeltaSink(str(table), mode="merge", keys=["user"]), output_mode="update")
