"""Shadow follow mode (`runtime.follow`, #49) with real drivers: blue runs its own
``spark-submit`` (``jobs/shadow_totals.py``: per-user totals from a JSON file source, one
file per batch), green follows it in this process with the same query.

1. Delta append, blue running (processingTime): green starts from blue's newest
   checkpoint while new input keeps arriving, replays blue's batches through batch 5 and
   ends; green's checkpointed state at 5 equals the totals of the input (a plain-Python
   oracle) and blue's own state at 5; blue's catalog and table hold nothing of green.
2. Directory sink, blue drained and exited: green starts from an older checkpoint of
   blue's, ends when blue's recorded batches are replayed; blue's whole root and output
   directory are byte for byte what they were; a green whose results differ is stopped
   by the comparison gate at the first differing batch, naming the rows.
3. A blue reading the rate source: green is refused before anything is written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.follow_record import read_follow
from airflow_sparkpoint.demo.support import SubmittedJob, delta_commits, write_batch_file
from airflow_sparkpoint.exceptions import ConfigError, SparkpointError
from tests.support.shadow_totals import FILES, JOB_SCRIPT, job_module, oracle, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a blue spark-submit each, about a minute

def follow(blue: SubmittedJob, shadow_root: Path, sink: str, mode: str = "discard", changed: bool = False,
           **shadow: str) -> Any:
    """Run green as blue's shadow in this process (blue's production arguments); a
    `changed` green adds 1 to every total of user u4 (another result, the same state)."""
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob

    script = job_module()
    conf = {"spark.sparkpoint.dir": str(blue.root), "spark.sparkpoint.job": blue.job,
            "spark.sparkpoint.shadow.mode": mode, "spark.sparkpoint.shadow.dir": str(shadow_root),
            "spark.sparkpoint.shadow.pollInterval": "0.3s",
            **{f"spark.sparkpoint.shadow.{k}": v for k, v in shadow.items()}}
    job = SparkpointJob.get_or_create(conf=conf, argv=["--input", str(blue.input), "--output",
                                                       str(blue.output), "--sink", sink])
    query = script.totals(job)
    if changed:
        query = query.withColumn("total", F.when(F.col("user") == "u4", F.col("total") + 1)
                                 .otherwise(F.col("total")))
    return job.run(query, sink=script.sink_of(job), output_mode="update")


def state_at(spark: Any, catalog: Catalog, batch: int) -> dict[str, tuple[int, int]]:
    """(sum, count) by user in the aggregation's state of `catalog`'s checkpoint of `batch`."""
    from airflow_sparkpoint.runtime.state_inspect import rows_as_json, state_rows

    meta = next(m for m in catalog.checkpoints() if m.batch_id == batch)
    rows = rows_as_json(state_rows(spark, catalog.handle(meta)))
    got = {}
    for row in rows:
        values = [v for v in row["value"].values()]
        got[row["key"]["user"]] = (int(values[0]), int(values[1]))
    return got


def tree(root: Path, skip_status: bool = False) -> dict[str, bytes]:
    files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {k: p.read_bytes() for k, p in files.items()
            if not (skip_status and (k.endswith("status.json") or "/status/" in k))}


@pytest.fixture
def blue_delta(tmp_path: Path):  # type: ignore[no-untyped-def]
    blue = SubmittedJob(tmp_path / "blue", JOB_SCRIPT, "totals", "processingTime:1s", ["--sink", "delta"])
    for index, users in enumerate(FILES[:3]):
        write_batch_file(blue.input, index, rows_of(index, users))
    blue.start()
    try:
        yield blue
    finally:
        blue.kill()


def test_green_follows_a_running_blue_into_the_same_state_and_writes_nothing_of_blue(
        spark: Any, blue_delta: SubmittedJob, tmp_path: Path) -> None:
    blue = blue_delta
    generation = blue.wait_checkpointed(2)
    generations_before = blue.catalog.generations()
    start = blue.catalog.latest()
    assert start is not None

    shadow_root = tmp_path / "shadow"
    progress_file = shadow_root / "totals-shadow" / "follow.json"
    seen_behind: list[int] = []

    def feed() -> None:  # new input once green follows: blue runs ahead, green catches up
        deadline = time.monotonic() + 300
        while not progress_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for index in range(3, len(FILES)):
            write_batch_file(blue.input, index, rows_of(index, FILES[index]))
            time.sleep(2.0)
            progress = read_follow(Catalog.open(str(shadow_root), "totals-shadow").store)
            if progress is not None and progress.behind is not None:
                seen_behind.append(progress.behind)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        result = follow(blue, shadow_root, "delta", "compare", untilBatch="5",
                        **{"from": blue.catalog.handle(start).uri})
    finally:
        feeder.join()
    assert (result.status, result.job, result.last_batch) == ("finished", "totals-shadow", 5), result

    shadow = Catalog.open(str(shadow_root), "totals-shadow")
    progress = read_follow(shadow.store)
    assert progress is not None
    assert (progress.state, progress.started_batch, progress.last_replayed) == ("ended", start.batch_id, 5)
    assert progress.seconds_per_batch is not None and progress.seconds_per_batch > 0
    assert seen_behind, "the feeder never read green's progress while it followed"
    # compare mode: green's rows of every batch equal the rows blue appended for it
    assert (progress.compared_through, progress.difference) == (5, None)
    latest = shadow.latest()
    assert latest is not None and latest.batch_id == 5
    # Green's own checkpoints hold blue's batches: the same offsets, batch by batch.
    assert state_at(spark, shadow, 5) == oracle(FILES)

    blue.wait_checkpointed(5)
    assert state_at(spark, blue.catalog, 5) == oracle(FILES)  # blue is the reference too
    # Blue's catalog: no generation, transaction or record of green's.
    assert blue.catalog.generations() == generations_before
    assert {g for _b, g in blue.catalog.transaction_keys()} <= {generation}
    for path in (blue.root / blue.job).rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert b"totals-shadow" not in path.read_bytes(), path
    # Blue's table: one commit per batch, all blue's, rows as the input says.
    commits = [(c["job"], c["batch"], c["generation"]) for c in delta_commits(blue.output)]
    assert commits == [("totals", b, generation) for b in range(6)], commits
    assert not (blue.output / "_staging").exists() or not any((blue.output / "_staging").iterdir())


def test_green_follows_a_drained_blue_from_an_older_checkpoint_and_blue_is_byte_identical(
        spark: Any, tmp_path: Path) -> None:
    blue = SubmittedJob(tmp_path / "blue", JOB_SCRIPT, "totals", "availableNow", ["--sink", "dir"])
    for index, users in enumerate(FILES):
        write_batch_file(blue.input, index, rows_of(index, users))
    blue.start()
    try:
        assert blue.wait_exit(timeout=300) == 0, blue.tail()
    finally:
        blue.kill()
    oldest = min(blue.catalog.checkpoints(), key=lambda m: m.batch_id)
    assert oldest.batch_id < 5
    before_root, before_output = tree(blue.root), tree(blue.output)

    result = follow(blue, tmp_path / "shadow", "dir", **{"from": blue.catalog.handle(oldest).uri})
    assert (result.status, result.job, result.last_batch) == ("finished", "totals-shadow", 5), result

    shadow = Catalog.open(str(tmp_path / "shadow"), "totals-shadow")
    progress = read_follow(shadow.store)
    assert progress is not None and (progress.state, progress.last_replayed) == ("ended", 5)
    assert progress.started_batch == oldest.batch_id
    assert state_at(spark, shadow, 5) == oracle(FILES)
    assert tree(blue.root) == before_root
    assert tree(blue.output) == before_output

    # A green that computes another result is stopped by the comparison gate, at the first
    # batch that touches u4 (batch 4), naming the rows.
    with pytest.raises(SparkpointError) as caught:
        follow(blue, tmp_path / "shadow-changed", "dir", "compare", changed=True,
               **{"from": blue.catalog.handle(oldest).uri})
    message = str(caught.value)
    assert "differs from what blue committed" in message and "batch 4" in message, message
    assert '"total": 46' in message and '"total": 45' in message, message  # green's u4 vs blue's
    changed = read_follow(Catalog.open(str(tmp_path / "shadow-changed"), "totals-shadow").store)
    assert changed is not None and changed.state == "failed" and "batch 4" in (changed.difference or "")
    assert changed.compared_through == (3 if oldest.batch_id < 3 else None)
    assert tree(blue.root) == before_root
    assert tree(blue.output) == before_output


def test_a_blue_reading_the_rate_source_is_refused_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    """Blue (in this process) reads Spark's rate source: its checkpoints hold counter
    offsets, whose input is not kept. Green's start is refused naming the source, before
    the shadow's root exists."""
    from pyspark.sql import functions as F

    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink
    from tests.support.waits import wait_for

    root, table = tmp_path / "blue", tmp_path / "table"
    conf = {"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "ticks",
            "spark.sparkpoint.trigger": "processingTime:1s", "spark.sparkpoint.control.pollInterval": "300ms"}
    blue = SparkpointJob.get_or_create(conf=conf, argv=[])
    ticks = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    counts = ticks.groupBy((F.col("value") % 3).alias("k")).count()
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = blue.run(counts, sink=DeltaSink(str(table), mode="append"),
                                         output_mode="update")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    catalog = Catalog.open(str(root), "ticks")
    try:
        wait_for("blue's checkpoint of batch 1", lambda: (catalog.latest() or None) is not None
                 and catalog.latest().batch_id >= 1, 120)  # type: ignore[union-attr]
    finally:
        status = catalog.read_status()
        if status is not None:
            channel = ControlChannel(catalog)
            channel.wait(channel.submit("stop", generation=int(status["generation"]), timeout_s=60).id,
                         timeout_s=60, poll_s=0.3)
        thread.join(60)
    assert "error" not in outcome, outcome.get("error")

    shadow_root = tmp_path / "shadow"
    green = SparkpointJob.get_or_create(conf={
        **conf, "spark.sparkpoint.shadow.mode": "discard", "spark.sparkpoint.shadow.dir": str(shadow_root)},
        argv=[])
    with pytest.raises(ConfigError) as caught:
        green.run(counts, sink=DeltaSink(str(table), mode="append"), output_mode="update")
    message = str(caught.value)
    assert "job 'ticks' cannot be followed by a shadow" in message and "counter offset" in message, message
    assert "rate" in message, message
    assert not shadow_root.exists(), "the refusal wrote into the shadow's root"
