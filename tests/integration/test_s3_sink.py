"""`S3Sink` against a real Spark and the moto S3 endpoint: pending multipart uploads as
the pre-commit, completion as the commit, manifests as the "did it land?" marker."""

from __future__ import annotations

import io
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.sinks.base import StageContext
from airflow_sparkpoint.sinks.registry import sink_from_config
from airflow_sparkpoint.sinks.s3 import MIN_PART_SIZE, S3Sink, multipart_etag
from tests.support.inputs import write_json_batches
from tests.support.records import transaction_record

pytestmark = [pytest.mark.spark, pytest.mark.s3]

JOB = "orders"
SECRET = f"sp-secret-{uuid.uuid4().hex}"
SCHEMA = "id long, user string, amount double"


@pytest.fixture()
def options(s3_server: str) -> dict[str, Any]:
    return {
        "endpoint_url": s3_server,
        "region_name": "us-east-1",
        "aws_access_key_id": "sp-test-key",
        "aws_secret_access_key": SECRET,
    }


@pytest.fixture()
def client(s3_server: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")


@pytest.fixture()
def sink(s3_bucket: str, options: dict[str, Any]) -> S3Sink:
    sink = S3Sink(f"s3a://{s3_bucket}/out")
    sink.configure(options)
    return sink


def stage(sink: S3Sink, df: Any, batch: int, generation: int = 1,
          options: dict[str, Any] | None = None) -> TransactionRecord:
    """What the runtime does in foreachBatch: stage, then record the pre-commit."""
    ctx = StageContext(JOB, batch, generation, options or {})
    staged = sink.stage(df, ctx)
    return transaction_record(sink, batch, generation, staged, job=JOB)


def rows_of(spark: Any, batch: int) -> Any:
    return spark.createDataFrame(
        [(batch * 1000 + i, f"user-{i % 7}", i * 1.5) for i in range(50)], SCHEMA
    ).repartition(3)


def final_keys(client: Any, bucket: str, prefix: str = "out/") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", ()) if "/_sparkpoint/" not in o["Key"])


def pending(client: Any, bucket: str, prefix: str = "out/") -> list[tuple[str, str]]:
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    return sorted((u["Key"], u["UploadId"]) for p in pages for u in p.get("Uploads", ()))


def read_parquet_rows(client: Any, bucket: str, keys: list[str]) -> list[tuple[Any, ...]]:
    import pyarrow.parquet as pq

    rows: list[tuple[Any, ...]] = []
    for key in keys:
        table = pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=key)["Body"].read()))
        rows.extend(tuple(r.values()) for r in table.to_pylist())
    return sorted(rows)


def test_stage_is_invisible_commit_shows_exact_rows_once(
    spark: Any, sink: S3Sink, client: Any, s3_bucket: str
) -> None:
    df = rows_of(spark, 0)
    expected = sorted(tuple(r) for r in df.collect())

    record = stage(sink, df, 0)

    uploads = record.payload["staged"]["uploads"]
    assert len(uploads) == 3 and record.payload["staged"]["rows"] == 50
    assert final_keys(client, s3_bucket) == []
    assert [key for key, _ in pending(client, s3_bucket)] == [u["key"] for u in uploads]
    assert not sink.is_committed(record)
    assert sink.committed_position(JOB) is None

    outcome = sink.commit(record)

    assert outcome.status == "committed" and outcome.detail["files"] == 3
    keys = final_keys(client, s3_bucket)
    assert keys == [f"out/part-orders-b0-g1-{p:05d}.parquet" for p in range(3)]
    assert read_parquet_rows(client, s3_bucket, keys) == expected
    assert pending(client, s3_bucket) == []
    assert sink.is_committed(record)
    assert sink.committed_position(JOB) == 0
    manifest = json.loads(client.get_object(Bucket=s3_bucket,
                                            Key="out/_sparkpoint/manifests/orders/0.json")["Body"].read())
    assert manifest["txn_id"] == "orders-b0-g1" and [f["key"] for f in manifest["files"]] == keys

    again = sink.commit(record)
    assert again.status == "already"
    assert final_keys(client, s3_bucket) == keys
    assert read_parquet_rows(client, s3_bucket, keys) == expected


def test_abort_of_another_transaction_leaves_nothing(
    spark: Any, sink: S3Sink, client: Any, s3_bucket: str
) -> None:
    committed = stage(sink, rows_of(spark, 0), 0)
    sink.commit(committed)
    doomed = stage(sink, rows_of(spark, 1), 1)
    assert len(pending(client, s3_bucket)) == 3

    sink.abort(doomed)
    sink.abort(doomed)  # idempotent

    assert pending(client, s3_bucket) == []
    assert all("-b1-" not in key for key in final_keys(client, s3_bucket))
    assert not sink.is_committed(doomed)
    assert sink.committed_position(JOB) == 0
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(committed)


def test_crashed_commit_is_finished_and_a_partial_one_can_be_aborted(
    spark: Any, sink: S3Sink, client: Any, s3_bucket: str
) -> None:
    df = rows_of(spark, 0)
    record = stage(sink, df, 0)
    first = record.payload["staged"]["uploads"][0]
    parts = [{"PartNumber": n, "ETag": e} for n, e in first["parts"]]
    client.complete_multipart_upload(Bucket=s3_bucket, Key=first["key"], UploadId=first["upload_id"],
                                     MultipartUpload={"Parts": parts})  # the commit died after one file

    assert sink.commit(record).status == "committed"
    keys = final_keys(client, s3_bucket)
    assert len(keys) == 3
    assert read_parquet_rows(client, s3_bucket, keys) == sorted(tuple(r) for r in df.collect())

    other = stage(sink, rows_of(spark, 1), 1)
    second = other.payload["staged"]["uploads"][0]
    client.complete_multipart_upload(Bucket=s3_bucket, Key=second["key"], UploadId=second["upload_id"],
                                     MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                                                for n, e in second["parts"]]})
    sink.abort(other)  # never confirmed: its half-finished commit is undone
    assert final_keys(client, s3_bucket) == keys
    assert pending(client, s3_bucket) == []


def test_staging_a_batch_again_replaces_the_earlier_attempt(
    spark: Any, sink: S3Sink, client: Any, s3_bucket: str
) -> None:
    stage(sink, rows_of(spark, 0), 0)
    record = stage(sink, rows_of(spark, 0).repartition(2), 0)

    live = {(u["key"], u["upload_id"]) for u in record.payload["staged"]["uploads"]}
    assert set(pending(client, s3_bucket)) == live
    sink.commit(record)
    assert len(final_keys(client, s3_bucket)) == 2


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_json_and_csv_round_trip(spark: Any, sink: S3Sink, client: Any, s3_bucket: str, fmt: str,
                                 options: dict[str, Any]) -> None:
    fmt_sink = S3Sink(f"s3://{s3_bucket}/{fmt}", fmt)
    fmt_sink.configure(options)
    df = spark.createDataFrame([(1, "a", None), (2, "b,c", 2.5), (3, 'quote "x"', -1.0)], SCHEMA).coalesce(1)

    record = stage(fmt_sink, df, 0)
    fmt_sink.commit(record)

    (key,) = final_keys(client, s3_bucket, f"{fmt}/")
    assert key.endswith(f".{fmt}")
    body = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    if fmt == "json":
        rows = [json.loads(line) for line in body.decode().splitlines()]
        assert rows == [{"id": 1, "user": "a"}, {"id": 2, "user": "b,c", "amount": 2.5},
                        {"id": 3, "user": 'quote "x"', "amount": -1.0}]
    else:
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(io.BytesIO(body))
        assert table.column_names == ["id", "user", "amount"]
        assert table.to_pylist() == [{"id": 1, "user": "a", "amount": None},
                                     {"id": 2, "user": "b,c", "amount": 2.5},
                                     {"id": 3, "user": 'quote "x"', "amount": -1.0}]


def test_empty_batch_commits_only_its_manifest(spark: Any, sink: S3Sink, client: Any, s3_bucket: str) -> None:
    record = stage(sink, spark.createDataFrame([], SCHEMA), 4)

    assert record.payload["staged"]["uploads"] == []
    assert pending(client, s3_bucket) == []
    assert sink.commit(record).status == "committed"
    assert final_keys(client, s3_bucket) == []
    assert sink.is_committed(record) and sink.committed_position(JOB) == 4


def test_a_large_partition_is_uploaded_in_several_parts(
    spark: Any, sink: S3Sink, client: Any, s3_bucket: str
) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 400_000, numPartitions=1).select(
        F.col("id"), F.sha2(F.concat(F.lit("k"), F.col("id").cast("string")), 256).alias("s")
    )

    record = stage(sink, df, 0)

    (upload,) = record.payload["staged"]["uploads"]
    assert upload["size"] > MIN_PART_SIZE
    assert len(upload["parts"]) >= 2
    sink.commit(record)
    head = client.head_object(Bucket=s3_bucket, Key=upload["key"])
    assert head["ContentLength"] == upload["size"]
    assert head["ETag"].strip('"') == multipart_etag(upload["parts"])
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(client.get_object(Bucket=s3_bucket, Key=upload["key"])["Body"].read()))
    assert table.num_rows == 400_000 and table.column("id").to_pylist()[-1] == 399_999


@pytest.mark.slow  # 1,000+ uploads; the default run is at its 40-minute budget
def test_cleanup_orphans_pages_past_1000_pending_uploads(sink: S3Sink, client: Any, s3_bucket: str) -> None:
    def create(key: str) -> None:
        client.create_multipart_upload(Bucket=s3_bucket, Key=key)

    orphans = [f"out/part-orders-b{b}-g1-00000.parquet" for b in range(1100)]
    kept = ["out/part-orders-b5000-g2-00000.parquet", "out/part-orders-b5000-g2-00001.parquet"]
    foreign = [
        "out/part-orders-b7-g1-b1-g1-00000.parquet",  # job "orders-b7-g1", not "orders"
        "out/part-shipments-b1-g1-00000.parquet",
        "elsewhere/part-orders-b1-g1-00000.parquet",
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(create, orphans + kept + foreign))
    assert len(pending(client, s3_bucket, "")) == 1105

    assert sink.cleanup_orphans(JOB, keep={"orders-b5000-g2"}) == 1100

    left = sorted(key for key, _ in pending(client, s3_bucket, ""))
    assert left == sorted(kept + foreign)
    assert sink.cleanup_orphans(JOB, keep={"orders-b5000-g2"}) == 0


def test_credentials_stay_out_of_records_manifests_and_conf(
    spark: Any, s3_bucket: str, client: Any, options: dict[str, Any]
) -> None:
    fresh = S3Sink(f"s3://{s3_bucket}/secret")  # not configured: the options come with the batch
    record = stage(fresh, rows_of(spark, 0), 0, options=options)
    fresh.commit(record)

    assert SECRET not in json.dumps(record.to_json())
    assert SECRET not in repr(fresh) and SECRET not in json.dumps(fresh.to_config())
    assert SECRET not in str(spark.sparkContext.getConf().getAll())
    manifest = client.get_object(Bucket=s3_bucket,
                                 Key="secret/_sparkpoint/manifests/orders/0.json")["Body"].read()
    assert SECRET.encode() not in manifest

    rebuilt = sink_from_config(record.sink, record.payload["config"])
    rebuilt.configure(options)
    assert isinstance(rebuilt, S3Sink) and rebuilt.sink_id == fresh.sink_id
    assert rebuilt.is_committed(record) and rebuilt.commit(record).status == "already"


def test_validate_names_a_missing_bucket(options: dict[str, Any], sink: S3Sink) -> None:
    sink.validate()
    missing = S3Sink("s3://sp-no-such-bucket-here/out")
    missing.configure(options)
    with pytest.raises(SinkError, match="sp-no-such-bucket-here"):
        missing.validate()


def test_stages_every_batch_of_a_stateful_stream(spark: Any, sink: S3Sink, client: Any, s3_bucket: str,
                                                 tmp_path: Any) -> None:
    """Spark 4.2 fails a stateful batch whose foreachBatch does not read every partition."""
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    write_json_batches(source, [[{"user": f"u{i % 4}", "amount": i} for i in range(12)]] * 3, name="{}.json",
                       base_mtime=1_000)
    records: list[TransactionRecord] = []
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(source)))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"))
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
    latest = read_parquet_rows(client, s3_bucket,
                               [u["key"] for u in records[-1].payload["staged"]["uploads"]])
    assert latest == [("u0", 36), ("u1", 45), ("u2", 54), ("u3", 63)]  # running totals after three files
    assert sink.committed_position(JOB) == 2


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_spark_reads_back_exactly_what_was_committed(spark: Any, s3_bucket: str, client: Any,
                                                     options: dict[str, Any], tmp_path: Any,
                                                     fmt: str) -> None:
    import datetime
    import decimal

    schema = ("id long, ts timestamp, d date, dec decimal(38,18), tags array<string>, "
              "st struct<a:int,b:string>, m map<string,int>, bin binary, flag boolean")
    data = [
        (1, datetime.datetime(2024, 1, 2, 3, 4, 5, 678000), datetime.date(2024, 1, 2),
         decimal.Decimal("12345678901234567890.123456789012345678"), ["x", None], (1, None), {"k": 1},
         b"\x00\x01", True),
        (2, None, None, None, None, None, None, None, None),
    ]
    df = spark.createDataFrame(data, schema)
    fmt_sink = S3Sink(f"s3://{s3_bucket}/{fmt}", fmt)
    fmt_sink.configure(options)

    fmt_sink.commit(stage(fmt_sink, df, 0))

    for key in final_keys(client, s3_bucket, f"{fmt}/"):
        client.download_file(s3_bucket, key, str(tmp_path / key.rsplit("/", 1)[1]))
    read = spark.read.schema(schema).format(fmt).load(str(tmp_path))
    assert sorted(read.collect()) == sorted(df.collect())
