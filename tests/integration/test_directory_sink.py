"""`DirectorySink` with a real Spark: Spark's writer into ``_staging/<txn>``, promotion
by rename (local) or server-side copy (S3, through the moto endpoint)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.sinks.base import StageContext
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.registry import sink_from_config
from tests.support.inputs import write_json_batches
from tests.support.records import transaction_record

pytestmark = pytest.mark.spark

JOB = "orders"
SCHEMA = "id long, country string, amount double"


def stage(sink: DirectorySink, df: Any, batch: int, generation: int = 1,
          options: dict[str, Any] | None = None) -> TransactionRecord:
    ctx = StageContext(JOB, batch, generation, options or {})
    staged = sink.stage(df, ctx)
    return transaction_record(sink, batch, generation, staged, job=JOB)


def batch_df(spark: Any, batch: int, n: int = 40) -> Any:
    countries = ["DE", "FR", "US"]
    return spark.createDataFrame(
        [(batch * 1000 + i, countries[i % 3], i * 0.5) for i in range(n)], SCHEMA
    ).repartition(2)


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.select("id", "country", "amount").collect())


def data_files(root: Path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith("_")]
        found += [os.path.relpath(os.path.join(directory, f), root) for f in files
                  if not f.startswith((".", "_"))]
    return sorted(found)


@pytest.mark.parametrize("as_uri", [False, True], ids=["plain-path", "file-uri"])
def test_stage_is_invisible_commit_shows_exact_rows_once(spark: Any, tmp_path: Path, as_uri: bool) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(f"file://{dest}" if as_uri else str(dest))
    df = batch_df(spark, 0)
    expected = rows(df)

    record = stage(sink, df, 0)

    assert os.listdir(dest) == ["_staging"]
    assert spark.read.schema(SCHEMA).parquet(str(dest)).count() == 0
    staged = record.payload["staged"]
    assert staged["staging"] == "_staging/orders-b0-g1" and len(staged["files"]) == 2
    assert not sink.is_committed(record) and sink.committed_position(JOB) is None

    outcome = sink.commit(record)

    assert outcome.status == "committed"
    assert (data_files(dest)
            == ["part-orders-b0-g1-00000.snappy.parquet", "part-orders-b0-g1-00001.snappy.parquet"])
    assert rows(spark.read.parquet(str(dest))) == expected
    assert not (dest / "_staging" / "orders-b0-g1").exists()
    assert sink.is_committed(record) and sink.committed_position(JOB) == 0
    manifest = json.loads((dest / "_sparkpoint" / "manifests" / "orders" / "0.json").read_text())
    assert manifest["txn_id"] == "orders-b0-g1" and len(manifest["files"]) == 2

    assert sink.commit(record).status == "already"
    assert rows(spark.read.parquet(str(dest))) == expected


def test_abort_of_another_transaction_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    committed = stage(sink, batch_df(spark, 0), 0)
    sink.commit(committed)
    doomed = stage(sink, batch_df(spark, 1), 1)

    sink.abort(doomed)
    sink.abort(doomed)

    assert not (dest / "_staging" / "orders-b1-g1").exists()
    assert rows(spark.read.parquet(str(dest))) == rows(batch_df(spark, 0))
    assert sink.committed_position(JOB) == 0
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(committed)


def test_partitioned_output_keeps_partition_directories(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest), partition_by=["country"])
    df = batch_df(spark, 0)

    record = stage(sink, df, 0)
    assert spark.read.schema(SCHEMA).parquet(str(dest)).count() == 0
    sink.commit(record)
    sink.commit(stage(sink, batch_df(spark, 1), 1))

    files = data_files(dest)
    assert {f.split("/")[0] for f in files} == {"country=DE", "country=FR", "country=US"}
    assert all(os.path.basename(f).startswith(("part-orders-b0-g1-", "part-orders-b1-g1-")) for f in files)
    assert rows(spark.read.parquet(str(dest))) == sorted(rows(df) + rows(batch_df(spark, 1)))


def test_a_crashed_commit_is_finished_without_duplicates(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    df = batch_df(spark, 0)
    record = stage(sink, df, 0)
    first = record.payload["staged"]["files"][0]
    os.replace(dest / "_staging" / "orders-b0-g1" / first["path"],
               dest / "part-orders-b0-g1-00000.snappy.parquet")

    assert sink.commit(record).status == "committed"
    assert rows(spark.read.parquet(str(dest))) == rows(df)


def test_a_lost_staged_file_fails_the_commit(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    record = stage(sink, batch_df(spark, 0), 0)
    os.remove(dest / "_staging" / "orders-b0-g1" / record.payload["staged"]["files"][1]["path"])

    with pytest.raises(SinkError, match="output is lost"):
        sink.commit(record)
    assert not sink.is_committed(record)


def test_a_batch_committed_by_another_generation_is_not_committed_twice(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    sink.commit(stage(sink, batch_df(spark, 0), 0, generation=1))
    rerun = stage(sink, batch_df(spark, 0), 0, generation=2)

    with pytest.raises(SinkError, match="already committed .* 'orders-b0-g1'"):
        sink.commit(rerun)
    assert spark.read.parquet(str(dest)).count() == 40
    sink.abort(rerun)


def test_cleanup_orphans_removes_only_this_jobs_unkept_staging(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    for batch in (1, 2, 3):
        stage(sink, batch_df(spark, batch, 4), batch)
    (dest / "_staging" / "shipments-b1-g1").mkdir()
    (dest / "_staging" / "orders-b7-g1-b1-g1").mkdir()  # job "orders-b7-g1"

    assert sink.cleanup_orphans(JOB, keep={"orders-b2-g1"}) == 2

    assert sorted(os.listdir(dest / "_staging")) == ["orders-b2-g1", "orders-b7-g1-b1-g1", "shipments-b1-g1"]
    assert sink.cleanup_orphans(JOB, keep={"orders-b2-g1"}) == 0


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_other_formats_round_trip(spark: Any, tmp_path: Path, fmt: str) -> None:
    dest = tmp_path / fmt
    sink = DirectorySink(str(dest), fmt, options={"header": "true"} if fmt == "csv" else None)
    df = batch_df(spark, 0)

    record = stage(sink, df, 0)
    rebuilt = sink_from_config(record.sink, record.payload["config"])
    assert rebuilt.commit(record).status == "committed"

    assert all(f.endswith(f".{fmt}") for f in data_files(dest))
    reader = spark.read.schema(SCHEMA)
    read = reader.option("header", "true").csv(str(dest)) if fmt == "csv" else reader.json(str(dest))
    assert rows(read) == rows(df)


@pytest.mark.s3
def test_s3_destination_stages_hidden_and_promotes_by_copy(
    spark: Any, s3_server: str, s3_bucket: str
) -> None:
    import boto3
    import pyarrow.parquet as pq

    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    options = {"endpoint_url": s3_server, "region_name": "us-east-1"}
    sink = DirectorySink(f"s3a://{s3_bucket}/dir")
    sink.configure(options)
    sink.validate()
    df = batch_df(spark, 0)

    def keys() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="dir/")
        return sorted(o["Key"] for p in pages for o in p.get("Contents", ()))

    record = stage(sink, df, 0, options=options)
    assert keys() and all(k.startswith("dir/_staging/orders-b0-g1/") for k in keys())

    assert sink.commit(record).status == "committed"
    final = [k for k in keys() if not k.startswith("dir/_sparkpoint/")]
    assert (final
            == ["dir/part-orders-b0-g1-00000.snappy.parquet", "dir/part-orders-b0-g1-00001.snappy.parquet"])
    got = []
    for key in final:
        table = pq.read_table(io.BytesIO(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()))
        got += [tuple(r.values()) for r in table.to_pylist()]
    assert sorted(got) == rows(df)
    assert sink.commit(record).status == "already" and sink.committed_position(JOB) == 0

    doomed = stage(sink, batch_df(spark, 1), 1, options=options)
    sink.abort(doomed)
    assert [k for k in keys() if not k.startswith("dir/_sparkpoint/")] == final
    assert sink.cleanup_orphans(JOB, keep=set()) == 0


def test_stages_every_batch_of_a_stateful_stream(spark: Any, tmp_path: Path) -> None:
    """Spark 4.2 fails a stateful batch whose foreachBatch does not read every partition."""
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    write_json_batches(source, [[{"country": f"c{i % 4}", "amount": i} for i in range(12)]] * 3,
                       name="{}.json", base_mtime=1_000)
    dest = tmp_path / "out"
    sink = DirectorySink(str(dest))
    records: list[TransactionRecord] = []
    events = (spark.readStream.schema("country string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(source)))
    totals = events.groupBy("country").agg(F.sum("amount").alias("total"))
    query = (
        totals.writeStream.outputMode("update")
        .foreachBatch(lambda df, batch_id: records.append(stage(sink, df, batch_id)))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None

    assert [r.batch_id for r in records] == [0, 1, 2]
    for record in records:
        sink.commit(record)
    out = spark.read.parquet(str(dest))
    assert out.count() == 12  # four countries updated in each of three batches
    assert sorted(tuple(r) for r in out.groupBy("country").agg(F.max("total")).collect()) == [
        ("c0", 36), ("c1", 45), ("c2", 54), ("c3", 63)
    ]
    assert sink.committed_position(JOB) == 2
