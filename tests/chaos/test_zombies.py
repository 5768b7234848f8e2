"""Invariant 5: only the current generation acts. An old generation that keeps running
after a newer one started (a zombie blue, an orphaned driver of an earlier try) must
not complete a checkpoint nor commit: it fails fast with `StaleGeneration`.

* in-process (default run): the runtime in this test's SparkSession, then a newer
  generation is claimed and new input arrives;
* two real spark-submit processes (a headline promise, in the default run): blue keeps running, green starts
  from a savepoint of blue (a deploy), new input arrives; blue fails, green's retry is exact.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.exceptions import StaleGeneration
from tests.chaos.cases import JOB, job_script
from tests.chaos.harness import BATCHES, compare, spark_submit, write_inputs
from tests.support.sink_cases import DeltaMergeCase
from tests.support.waits import wait_for


def delta_version(table: Path) -> int | None:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).transaction_version(JOB) if DeltaTable.is_deltatable(str(table)) else None


@pytest.mark.spark
def test_a_superseded_generation_in_process_fails_fast_without_checkpoint_or_commit(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    root, inputs, table = tmp_path / "root", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=2)
    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.trigger": "processingTime:500ms", "spark.sparkpoint.control.pollInterval": "300ms",
    }, argv=[])
    events = spark.readStream.schema("id long, user string, amount long").option("maxFilesPerTrigger", 1) \
        .json(str(inputs))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = job.run(totals, sink=DeltaSink(str(table), mode="merge", keys=["user"]),
                                        output_mode="update")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    catalog = Catalog.open(str(root), JOB)
    wait_for("batch 1 committed", lambda: delta_version(table) == 1, 180)
    checkpoints_before = [m.id for m in catalog.checkpoints()]

    newer = catalog.claim_generation({"by": "test: a newer run started"}).generation
    write_inputs(inputs, files=1, start=2)
    thread.join(120)

    assert not thread.is_alive(), "the zombie kept running"
    assert isinstance(outcome.get("error"), StaleGeneration), outcome
    assert f"superseded by generation {newer}" in str(outcome["error"])
    assert [m.id for m in catalog.checkpoints()] == checkpoints_before, "the zombie completed a checkpoint"
    assert delta_version(table) == 1, "the zombie committed a batch"
    assert (catalog.read_status() or {}).get("state") != "finished"


@pytest.mark.spark
@pytest.mark.timeout(1800)
# slow (42 s): the default run fences zombies with real drivers in tests/races (sink races,
# takeover) and in-process above; `make test-all` runs it
@pytest.mark.slow
def test_zombie_blue_keeps_running_after_green_starts(tmp_path: Path) -> None:
    case = DeltaMergeCase(tmp_path)
    expected = write_inputs(tmp_path / "input")
    root = tmp_path / "checkpoints"
    conf = {"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.control.pollInterval": "300ms"}
    args = ["--input", str(tmp_path / "input"), "--output", case.output()]
    catalog = Catalog.open(str(root), JOB)
    blue_conf = {**conf, "spark.sparkpoint.restore": "latest",
                 "spark.sparkpoint.trigger": "processingTime:500ms"}
    blue_run: dict[str, Any] = {}
    blue = threading.Thread(target=lambda: blue_run.update(run=spark_submit(
        job_script(case), conf=blue_conf, args=args, log=tmp_path / "blue.log")), daemon=True)
    blue.start()
    wait_for("blue committed every batch", lambda: delta_version(tmp_path / "output") == BATCHES - 1, 180)

    # The deploy: a savepoint of the running blue, green starts from it; blue is not stopped.
    channel = ControlChannel(catalog)
    savepoint = channel.wait(channel.submit("savepoint", generation=int(catalog.read_status()["generation"]),
                                            timeout_s=120).id, timeout_s=120, poll_s=0.3).savepoint
    assert savepoint
    # Green runs elsewhere (its own work dir: it must not touch blue's live checkpoint).
    green_conf = {**conf, "spark.sparkpoint.workDir": str(tmp_path / "green-work"),
                  "spark.sparkpoint.takeover": "true"}  # green fences the running blue on purpose
    green = spark_submit(job_script(case), conf={**green_conf, "spark.sparkpoint.restore": savepoint},
                         args=args, log=tmp_path / "green.log")
    assert green.returncode == 0, green.tail()
    assert catalog.current_generation() == 2
    latest = catalog.latest()
    assert latest is not None and latest.generation == 2, "green's checkpoint after the restore must be valid"
    checkpoints_before = {m.id for m in catalog.checkpoints()}

    # New input: the zombie blue processes it, and must stop at its checkpoint.
    expected += write_inputs(tmp_path / "input", files=1, start=BATCHES)
    blue.join(300)
    assert not blue.is_alive()
    run = blue_run["run"]
    assert run.returncode != 0, "the zombie blue must fail"
    assert "StaleGeneration" in run.output and "superseded by generation 2" in run.output, run.tail()
    new = [m for m in catalog.checkpoints() if m.id not in checkpoints_before]
    assert all(m.generation != 1 for m in new), "the zombie completed a checkpoint"
    assert delta_version(tmp_path / "output") == BATCHES - 1, "the zombie committed a batch"
    assert (catalog.read_status() or {}).get("generation") == 2, "the zombie overwrote the status"

    # Green's next run (the Airflow retry path) takes over blue's leftovers and is exact.
    retry = spark_submit(job_script(case), conf={**green_conf, "spark.sparkpoint.restore": "latest"},
                         args=args, log=tmp_path / "green-retry.log")
    assert retry.returncode == 0, retry.tail()
    verdict = compare(case, expected, case.rows())
    assert verdict.exact, verdict.wrong
    assert case.leftovers(JOB) == [] and catalog.transactions() == []
