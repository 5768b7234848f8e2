"""Invariant 6 on real Spark: savepoints are relocatable and self-contained for every
stateful operator type. Each case runs the query once over all input (the reference),
then again in two halves: the first half, a savepoint, the savepoint moved elsewhere and
the original checkpoint root deleted, a restore from the moved copy over the rest. The
two Delta tables must be identical: lost state or duplicated output would differ."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, open_snapshot
from tests.support.inputs import write_json_batches
from tests.support.state_cases import aggregation, deduplication, run_job, table_rows

pytestmark = pytest.mark.spark



# -- the queries ------------------------------------------------------------------------------


def stream_join(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    left = (
        spark.readStream.schema("id string, ts timestamp, side string, v long")
        .option("maxFilesPerTrigger", 1).json(str(inputs)).where("side = 'L'")
        .select(F.col("id"), F.col("ts").alias("lts"), F.col("v").alias("lv")).withWatermark("lts", "1 hour")
    )
    right = (
        spark.readStream.schema("id string, ts timestamp, side string, v long")
        .option("maxFilesPerTrigger", 1).json(str(inputs)).where("side = 'R'")
        .select(F.col("id").alias("rid"), F.col("ts").alias("rts"), F.col("v").alias("rv"))
        .withWatermark("rts", "1 hour")
    )
    return left.join(right,
                     F.expr("id = rid AND rts BETWEEN lts - interval 1 hour AND lts + interval 1 hour"))


def keyed_state(spark: Any, inputs: Path) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class RunningTotals(StatefulProcessor):
        """ValueState (running total), ListState (last 3 amounts), MapState (count per tag)."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "total long")
            self.recent = handle.getListState("recent", "amount long")
            self.tags = handle.getMapState("tags", "tag string", "count long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            total = self.total.get()[0] if self.total.exists() else 0
            recent = [r[0] for r in self.recent.get()] if self.recent.exists() else []
            for frame in rows:
                for amount, tag in zip(frame["amount"], frame["tag"]):
                    total += int(amount)
                    recent = (recent + [int(amount)])[-3:]
                    count = self.tags.getValue((tag,))[0] if self.tags.containsKey((tag,)) else 0
                    self.tags.updateValue((tag,), (count + 1,))
            self.total.update((total,))
            self.recent.put([(a,) for a in recent])
            tags = ",".join(f"{k[0]}={v[0]}" for k, v in sorted(self.tags.iterator()))
            yield pd.DataFrame({"user": [key[0]], "total": [total], "recent": [",".join(map(str, recent))],
                                "tags": [tags]})

        def close(self) -> None:
            pass

    events = (
        spark.readStream.schema("user string, amount long, tag string").option("maxFilesPerTrigger", 1)
        .json(str(inputs))
    )
    return events.groupBy("user").transformWithStateInPandas(
        statefulProcessor=RunningTotals(),
        outputStructType="user string, total long, recent string, tags string",
        outputMode="Update", timeMode="None",
    )


def session_timers(spark: Any, inputs: Path) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Sessions(StatefulProcessor):
        """Event-time timers: a session closes 10 minutes after its last event."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "count long")
            self.deadline = handle.getValueState("deadline", "deadline long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            count = self.count.get()[0] if self.count.exists() else 0
            if self.deadline.exists():
                self.handle.deleteTimer(self.deadline.get()[0])
            last = 0
            for frame in rows:
                count += len(frame)
                last = max(last, int(frame["ts"].max().timestamp() * 1000))
            self.count.update((count,))
            self.deadline.update((last + 10 * 60 * 1000,))
            self.handle.registerTimer(last + 10 * 60 * 1000)
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            count = self.count.get()[0]
            closed = expiredTimerInfo.getExpiryTimeInMs()
            self.count.clear()
            self.deadline.clear()
            yield pd.DataFrame({"user": [key[0]], "closed_at_ms": [closed], "events": [count]})

        def close(self) -> None:
            pass

    events = (
        spark.readStream.schema("user string, ts timestamp").option("maxFilesPerTrigger", 1).json(str(inputs))
        .withWatermark("ts", "0 seconds")
    )
    return events.groupBy("user").transformWithStateInPandas(
        statefulProcessor=Sessions(), outputStructType="user string, closed_at_ms long, events long",
        outputMode="Append", timeMode="EventTime",
    )


def _ts(minute: int) -> str:
    return f"2026-01-01T00:{minute:02d}:00Z"


CASES = {
    "transformWithStateInPandas event-time timers": (
        session_timers,
        # u0 is active every 4 minutes (its session stays open); u1's first session times
        # out after the cut, by a timer registered before the savepoint. No timer is due
        # at the cut itself: an end-of-input no-data batch would fire it early.
        [[{"user": "u0", "ts": _ts(i * 4)}] + ([{"user": "u1", "ts": _ts(i * 4)}] if i in (0, 5) else [])
         for i in range(6)],
        {"mode": "append"}, "append",
    ),
    "aggregation": (
        aggregation,
        [[{"user": f"u{u}", "amount": i * 10 + u} for u in range(3)] for i in range(6)],
        {"mode": "merge", "keys": ["user"]}, "update",
    ),
    "dropDuplicates": (
        deduplication,
        # ids repeat across files, including across the savepoint cut
        [[{"id": f"e{(i * 2 + j) % 5}", "ts": _ts(i), "v": i * 10 + j} for j in range(2)] for i in range(6)],
        {"mode": "append"}, "append",
    ),
    "stream-stream join": (
        stream_join,
        # each left row's partner arrives two files later, so matches span the cut
        [[{"id": f"k{i}", "ts": _ts(i), "side": "L", "v": i},
          {"id": f"k{i - 2}", "ts": _ts(i), "side": "R", "v": -i}]
         for i in range(6)],
        {"mode": "append"}, "append",
    ),
    "transformWithStateInPandas": (
        keyed_state,
        [[{"user": f"u{u}", "amount": i + u, "tag": "ab"[(i + u) % 2]} for u in range(2)] for i in range(6)],
        {"mode": "merge", "keys": ["user"]}, "update",
    ),
}


@pytest.mark.parametrize(
    ("case", "state_store"),
    [pytest.param(case, "rocksdb", marks=[pytest.mark.spark_feature("transformWithState")] if
                  case.startswith("transformWithState") else []) for case in CASES]
    + [("aggregation", "hdfs"), ("dropDuplicates", "hdfs")],
)
def test_savepoint_is_relocatable_and_restores_exactly(spark, tmp_path, case, state_store):
    build, files, sink_kwargs, output_mode = CASES[case]
    half = len(files) // 2

    all_input = tmp_path / "all"
    write_json_batches(all_input, files)
    reference = run_job(spark, tmp_path / "ref-root", "ref", build, all_input, tmp_path / "ref-table",
                        sink_kwargs, output_mode, state_store=state_store)
    assert reference.status == "finished"

    inputs = tmp_path / "input"
    write_json_batches(inputs, files[:half])
    root = tmp_path / "root"
    first = run_job(spark, root, "job", build, inputs, tmp_path / "table", sink_kwargs, output_mode,
                    state_store=state_store)
    # Watermarked queries may add no-data batches; at least one batch per input file ran.
    assert first.status == "finished" and first.last_batch >= half - 1
    catalog = Catalog.open(str(root), "job")
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))

    moved = tmp_path / "elsewhere" / "my-savepoint"
    shutil.copytree(savepoint.uri.removeprefix("file://"), moved)
    shutil.rmtree(root)  # the original checkpoints, savepoints and live location are gone

    write_json_batches(inputs, files[half:], start=half)
    second = run_job(spark, tmp_path / "new-root", "job", build, inputs, tmp_path / "table", sink_kwargs,
                     output_mode, restore=str(moved), state_store=state_store)
    assert second.status == "finished"
    assert second.restored_from == str(moved)
    assert second.first_batch == first.last_batch + 1, "the restored run must continue after the savepoint"
    new_catalog = Catalog.open(str(tmp_path / "new-root"), "job")
    restored = new_catalog.latest()
    assert restored is not None and restored.batch_id == second.last_batch, \
        "the restored run checkpoints validly"
    # The savepoint's files went into the new job's shared area as hard links (same disk),
    # stored while Spark ran.
    saved = {(ref.path, ref.sha256): moved / ref.key for ref in open_snapshot(str(moved)).metadata.files}
    oldest = min(new_catalog.checkpoints(), key=lambda meta: meta.id)
    linked = [ref for ref in oldest.files if (ref.path, ref.sha256) in saved]
    assert linked, "the restored job's checkpoints reference none of the savepoint's files"
    for ref in linked:
        stored = tmp_path / "new-root" / "job" / ref.key
        assert stored.stat().st_ino == saved[(ref.path, ref.sha256)].stat().st_ino, ref.path
    expected = table_rows(tmp_path / "ref-table")
    assert expected, "the reference produced no output: the case checks nothing"
    assert table_rows(tmp_path / "table") == expected
    assert os.listdir(moved) == ["_metadata", "files"] or sorted(os.listdir(moved)) == ["_metadata", "files"]


def test_rollback_to_an_older_checkpoint_is_refused_unless_the_sink_is_rewound(spark, tmp_path):
    from airflow_sparkpoint.exceptions import SinkAheadError

    files = CASES["aggregation"][1][:4]
    kwargs = {"mode": "merge", "keys": ["user"]}
    write_json_batches(tmp_path / "all", files)
    run_job(spark, tmp_path / "ref-root", "ref", aggregation, tmp_path / "all", tmp_path / "ref-table",
            kwargs, "update")
    inputs, root, table = tmp_path / "input", tmp_path / "root", tmp_path / "table"
    write_json_batches(inputs, files)
    run_job(spark, root, "job", aggregation, inputs, table, kwargs, "update")
    catalog = Catalog.open(str(root), "job")
    older = catalog.checkpoints()[-1]  # the oldest retained checkpoint
    assert older.batch_id < 3
    before = table_rows(table)

    with pytest.raises(SinkAheadError, match="already committed batch 3"):
        run_job(spark, root, "job", aggregation, inputs, table, kwargs, "update",
                restore=catalog.checkpoint_uri(older.id))
    assert table_rows(table) == before, "a refused restore touches nothing"

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "job",
        "spark.sparkpoint.restore": catalog.checkpoint_uri(older.id),
        "spark.sparkpoint.restore.sinkAhead": "rewind",
    }, argv=[])
    result = job.run(aggregation(spark, inputs), sink=DeltaSink(str(table), **kwargs), output_mode="update")
    assert result.first_batch == older.batch_id + 1
    assert table_rows(table) == table_rows(tmp_path / "ref-table")


def test_incompatible_state_schema_fails_without_touching_output_or_savepoint(spark, tmp_path):
    from pyspark.sql import functions as F

    from airflow_sparkpoint.exceptions import SparkpointError

    files = CASES["aggregation"][1]
    kwargs = {"mode": "merge", "keys": ["user"]}
    inputs, root, table = tmp_path / "input", tmp_path / "root", tmp_path / "table"
    write_json_batches(inputs, files[:2])
    run_job(spark, root, "job", aggregation, inputs, table, kwargs, "update")
    catalog = Catalog.open(str(root), "job")
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    saved = {i.key: i.size for i in catalog.store.list("savepoints")}
    before = table_rows(table)
    write_json_batches(inputs, files[2:], start=2)

    def changed(spark: Any, inputs: Path) -> Any:
        events = spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
            str(inputs))
        return events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("n"),
                                          F.max("amount").alias("largest"))

    with pytest.raises(SparkpointError) as info:
        run_job(spark, root, "job", changed, inputs, table, {"mode": "merge", "keys": ["user"]}, "update",
                restore=savepoint.uri)
    assert "schema" in str(info.value).lower()
    assert table_rows(table) == before
    assert {i.key: i.size for i in catalog.store.list("savepoints")} == saved


def test_a_savepoint_of_a_newer_spark_line_is_refused_before_anything_is_written(spark, tmp_path):
    """Spark reads the checkpoints of its own and older lines only (issue #29): a savepoint
    whose ``_metadata`` records a newer line than the running Spark is refused at restore,
    naming both versions, with the table and the savepoint untouched."""
    from airflow_sparkpoint.checkpoints import SnapshotMetadata
    from airflow_sparkpoint.exceptions import RestoreError
    from airflow_sparkpoint.sinks.spark_compat import spark_line

    files = CASES["aggregation"][1]
    kwargs = {"mode": "merge", "keys": ["user"]}
    inputs, root, table = tmp_path / "input", tmp_path / "root", tmp_path / "table"
    write_json_batches(inputs, files[:2])
    run_job(spark, root, "job", aggregation, inputs, table, kwargs, "update")
    catalog = Catalog.open(str(root), "job")
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    metadata = Path(savepoint.uri.removeprefix("file://")) / "_metadata"
    meta = SnapshotMetadata.from_bytes(metadata.read_bytes())
    assert meta.spark.get("version") == spark.version, meta.spark  # what the runtime records
    newer = f"{spark_line(spark.version)[0] + 1}.0.0"
    metadata.write_bytes(meta.with_(spark={**meta.spark, "version": newer}).to_bytes())
    saved = {i.key: (i.size, i.mtime) for i in catalog.store.list("savepoints")}
    before = table_rows(table)
    generation = catalog.current_generation()
    write_json_batches(inputs, files[2:], start=2)

    with pytest.raises(RestoreError,
                       match=rf"was taken on Spark {newer}; this Spark {spark.version} is an older line"):
        run_job(spark, root, "job", aggregation, inputs, table, kwargs, "update", restore=savepoint.uri)
    # refused before the claim: a running generation of the job would not have been fenced
    assert catalog.current_generation() == generation
    assert table_rows(table) == before
    assert {i.key: (i.size, i.mtime) for i in catalog.store.list("savepoints")} == saved


def test_a_restore_hands_spark_only_the_state_versions_it_loads(spark, tmp_path):
    """With changelog checkpointing off, RocksDB writes a snapshot (``<v>.zip``) at every
    commit. A restore from the savepoint of batch 1 materializes version 2's snapshot and
    the SST files, never version 1 (which Spark would not read); the new job's checkpoints
    therefore hold none of it, and the totals are exact (computed here from the input)."""
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    files = [[{"user": f"u{u}", "amount": i * 10 + u} for u in range(3)] for i in range(4)]
    inputs, table = tmp_path / "input", tmp_path / "table"

    def run(root: Path, restore: str) -> Any:
        job = SparkpointJob.get_or_create(conf={
            "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "job",
            "spark.sparkpoint.restore": restore,
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false",
        }, argv=[])
        return job.run(aggregation(spark, inputs), sink=DeltaSink(str(table), mode="merge", keys=["user"]),
                       output_mode="update")

    write_json_batches(inputs, files[:2])
    first = run(tmp_path / "root", "latest")
    assert first.status == "finished" and first.last_batch == 1
    catalog = Catalog.open(str(tmp_path / "root"), "job")
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    zips = sorted(ref.path for ref in savepoint.metadata.files if ref.path.endswith(".zip"))
    stores = {path.rpartition("/")[0] for path in zips}
    assert zips == sorted(f"{store}/{v}.zip" for store in stores for v in (1, 2)), zips

    write_json_batches(inputs, files[2:], start=2)
    second = run(tmp_path / "new-root", savepoint.uri)
    assert second.status == "finished" and (second.first_batch, second.last_batch) == (2, 3)
    assert second.live_reuse["mode"] == "materialized" and second.live_reuse["skipped"] == len(stores)
    for meta in Catalog.open(str(tmp_path / "new-root"), "job").checkpoints():
        versions = {ref.path for ref in meta.files if ref.path.endswith(".zip")}
        assert not versions & {f"{store}/1.zip" for store in stores}, (meta.id, sorted(versions))
    totals = {f"u{u}": sum(i * 10 + u for i in range(4)) for u in range(3)}
    assert ({r["user"]: (r["total"], r["n"]) for r in table_rows(table)}
            == {u: (t, 4) for u, t in totals.items()})
