"""`DeltaSink` on S3 against real local Spark and moto's S3 server over HTTP: the driver
or the executors stage parquet objects under ``_sparkpoint_txn/``, one keyed delta-rs commit per batch
(created with a conditional put), restarts that stage a batch again never duplicate it,
merge is exact, bad input fails before anything is written, and the rewind policy.

moto runs in a child process here (``s3_server_process``), not in the test process:
some delta-rs calls (``DeltaTable.history``, ``restore``, ``is_deltatable``) keep the GIL
while they wait for S3, so a Python S3 server in the same process would never answer
them. A real deployment never runs its S3 endpoint inside the driver.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import ConfigError, SinkAheadError, SinkError, TransactionConflict
from airflow_sparkpoint.sinks import DeltaSink, sink_from_config
from tests.support.delta_staging import (  # noqa: F401 - staging_side: autouse
    DRIVER_MAX_BYTES,
    rewind_target,
    side,
    stage,
    staging_side,
)
from tests.support.inputs import write_json_batches
from tests.support.records import transaction_record

pytestmark = [pytest.mark.spark, pytest.mark.s3]

SECRET = f"sp-delta-secret-{uuid.uuid4().hex}"
@pytest.fixture(scope="module")
def endpoint(s3_server_process: str) -> str:
    """moto in a child process (see `s3_server_process`)."""
    return s3_server_process


@pytest.fixture()
def client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


@pytest.fixture()
def bucket(client: Any) -> str:
    name = f"sp-delta-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture()
def options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "region_name": "us-east-1",
            "aws_access_key_id": "sp-delta-key", "aws_secret_access_key": SECRET}


def delta_options(endpoint: str) -> dict[str, str]:
    """How a reader (not the sink) opens the table with delta-rs."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "reader",
            "AWS_SECRET_ACCESS_KEY": "reader", "AWS_ALLOW_HTTP": "true"}


def make_sink(bucket: str, options: dict[str, Any], table: str = "t", **kwargs: Any) -> DeltaSink:
    sink = DeltaSink(f"s3://{bucket}/warehouse/{table}", **kwargs)
    sink.configure(options)
    return sink


def keys(client: Any, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", ()))


def staged_keys(client: Any, bucket: str, table: str = "t") -> list[str]:
    return keys(client, bucket, f"warehouse/{table}/_sparkpoint_txn/")


def table(endpoint: str, bucket: str, name: str = "t") -> Any:
    from deltalake import DeltaTable

    return DeltaTable(f"s3://{bucket}/warehouse/{name}", storage_options=delta_options(endpoint))


def rows(endpoint: str, bucket: str, *order: str, name: str = "t") -> list[dict[str, Any]]:
    data = table(endpoint, bucket, name).to_pyarrow_table().to_pylist()
    return sorted(data, key=lambda r: tuple((r[k] is None, r[k] or "") for k in order))


# -- append --------------------------------------------------------------------------------


def test_append_partitioned_batches_commit_once_across_restarts(
    spark, endpoint, client, bucket, options, tmp_path
):
    sink = make_sink(bucket, options, partition_by=["day"])
    sink.validate()
    schema = "k string, v long, day string"
    first = spark.createDataFrame([("a", 1, "d1"), ("b", 2, "d2"), ("c", 3, "d 3:x/y"), ("n", 4, None)],
                                  schema).repartition(2)

    record = stage(sink, first, 0)

    assert keys(client, bucket, "warehouse/t/_delta_log/") == [], "staged output must not be visible"
    staged = record.payload["staged"]
    assert staged["rows"] == 4
    assert {tuple(f["partition_values"].items()) for f in staged["files"]} == {
        (("day", "d1"),), (("day", "d2"),), (("day", "d 3:x/y"),), (("day", None),)}
    assert [f"warehouse/t/{f['path']}" for f in staged["files"]] == staged_keys(client, bucket)
    assert all(f["path"].startswith("_sparkpoint_txn/job/job-b0-g1/day=") for f in staged["files"])
    assert not sink.is_committed(record)

    assert sink.commit(record).status == "committed"
    assert sink.commit(record).status == "already"  # transaction_version says it landed
    assert sink.is_committed(record)
    assert rows(endpoint, bucket, "k") == [{"k": "a", "v": 1, "day": "d1"}, {"k": "b", "v": 2, "day": "d2"},
                                           {"k": "c", "v": 3, "day": "d 3:x/y"},
                                           {"k": "n", "v": 4, "day": None}]
    delta = table(endpoint, bucket)
    assert delta.metadata().partition_columns == ["day"]
    assert delta.transaction_version("job") == 0 and sink.committed_position("job") == 0

    # Spark has no s3a filesystem on this machine (no hadoop-aws jars), so it cannot read
    # s3:// itself. The objects the table references, downloaded as they are, must be
    # plain parquet in Spark's own partition layout.
    import urllib.parse

    import pyarrow as pa

    for logged in pa.table(delta.get_add_actions(flatten=True)).column("path").to_pylist():
        path = urllib.parse.unquote(logged)  # the log holds paths percent-encoded
        local = tmp_path / "copy" / path.removeprefix("_sparkpoint_txn/job/job-b0-g1/")
        local.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, f"warehouse/t/{path}", str(local))
    read = spark.read.schema(schema).parquet(str(tmp_path / "copy"))
    assert sorted(tuple(r) for r in read.collect()) == sorted(tuple(r) for r in first.collect())

    second = stage(sink, spark.createDataFrame([("d", 5, "d1")], schema), 1)
    assert sink.commit(second).status == "committed"

    # A restart (generation 2) stages batch 1 again: its commit is a no-op, and aborting
    # it leaves the files the table references alone.
    again = stage(sink, spark.createDataFrame([("d", 5, "d1")], schema), 1, generation=2)
    with pytest.raises(TransactionConflict, match="by transaction job-b1-g1"):
        sink.commit(again)
    assert not sink.is_committed(again) and sink.is_committed(second)
    sink.abort(again)
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(second)  # committed: refused, files kept
    assert not any("/job-b1-g2/" in k for k in staged_keys(client, bucket))

    # Batch 2 staged by generation 2, which dies before its commit; generation 3 stages it
    # again (twice: an earlier attempt of a transaction is replaced) and commits it.
    stage(sink, spark.createDataFrame([("e", 6, "d2")], schema), 2, generation=2)
    stage(sink, spark.createDataFrame([("e", 6, "d2"), ("x", 0, "d9")], schema), 2, generation=3)
    third = stage(sink, spark.createDataFrame([("e", 6, "d2")], schema), 2, generation=3)
    assert {k.split("/")[4] for k in staged_keys(client, bucket)} == {"job-b0-g1", "job-b1-g1", "job-b2-g2",
                                                                      "job-b2-g3"}
    assert [f"warehouse/t/{f['path']}" for f in third.payload["staged"]["files"]] == [
        k for k in staged_keys(client, bucket) if "/job-b2-g3/" in k]
    assert sink.commit(third).status == "committed"
    assert sink.cleanup_orphans("job", keep=set()) == 1  # job-b2-g2; the committed ones are referenced
    assert {k.split("/")[4] for k in staged_keys(client, bucket)} == {"job-b0-g1", "job-b1-g1", "job-b2-g3"}
    assert [r["k"] for r in rows(endpoint, bucket, "k")] == ["a", "b", "c", "d", "e", "n"]
    assert table(endpoint, bucket).version() == 2 and sink.committed_position("job") == 2


# -- merge ---------------------------------------------------------------------------------


def test_merge_batches_are_exact_and_leave_no_staging(spark, endpoint, client, bucket, options):
    sink = make_sink(bucket, options, mode="merge", keys=["user"])
    schema = "user string, total long"
    batches = [[("u1", 10), ("u2", 5)], [("u1", 15)], [("u2", 7), ("u3", 1)]]
    records = []
    for batch, data in enumerate(batches):
        record = stage(sink, spark.createDataFrame(data, schema), batch)
        assert staged_keys(client, bucket), "the merge source is staged on S3"
        assert sink.commit(record).status == "committed"
        assert sink.commit(record).status == "already"
        assert staged_keys(client, bucket) == [], "merged staging is removed"
        records.append(record)
    # A restart stages batch 1 again with other (late) values: never merged twice.
    again = stage(sink, spark.createDataFrame([("u1", 999)], schema), 1, generation=2)
    with pytest.raises(TransactionConflict, match="by transaction job-b1-g1 \\(generation 1\\)"):
        sink.commit(again)
    sink.abort(again)

    assert staged_keys(client, bucket) == []
    assert rows(endpoint, bucket, "user") == [{"user": "u1", "total": 15}, {"user": "u2", "total": 7},
                                              {"user": "u3", "total": 1}]
    history = table(endpoint, bucket).history()
    assert [h["operation"] for h in history] == ["MERGE", "MERGE", "WRITE"]
    assert [h.get("sparkpoint.batch") for h in history] == ["2", "1", "0"]
    assert sink.committed_position("job") == 2 and all(sink.is_committed(r) for r in records)


def test_a_stale_writer_never_overwrites_a_commit(spark, endpoint, client, bucket, options):
    """The log entry is created with a conditional put: a writer that still sees an older
    version loses the race for the next one instead of replacing it, and a second commit
    for the same job's batch is refused as a concurrent transaction."""
    import deltalake
    import pyarrow as pa

    sink = make_sink(bucket, options)
    schema = "k string, v long"
    sink.commit(stage(sink, spark.createDataFrame([("a", 0)], schema), 0))
    opts = sink.location.delta_options()
    assert opts["conditional_put"] == "etag" and opts["AWS_S3_ALLOW_UNSAFE_RENAME"] == "false"
    stale = deltalake.DeltaTable(sink.path, storage_options=opts)  # sees version 0

    sink.commit(stage(sink, spark.createDataFrame([("b", 1)], schema), 1))
    first = client.get_object(Bucket=bucket,
                              Key="warehouse/t/_delta_log/00000000000000000001.json")["Body"].read()
    props = deltalake.CommitProperties(app_transactions=[deltalake.Transaction(app_id="job", version=1)])
    with pytest.raises(Exception, match="(?i)concurrent"):
        deltalake.write_deltalake(stale, pa.table({"k": ["zombie"], "v": [9]}), mode="append",
                                  commit_properties=props)

    again = client.get_object(Bucket=bucket,
                              Key="warehouse/t/_delta_log/00000000000000000001.json")["Body"].read()
    assert again == first
    assert [r["k"] for r in rows(endpoint, bucket, "k")] == ["a", "b"]
    assert table(endpoint, bucket).version() == 1


def test_schema_mismatch_fails_before_staging(spark, client, bucket, options):
    sink = make_sink(bucket, options)
    sink.commit(stage(sink, spark.createDataFrame([("a", 1)], "k string, v long"), 0))
    before = staged_keys(client, bucket)

    with pytest.raises(SinkError, match="do not match Delta table"):
        stage(sink, spark.createDataFrame([("a", 1, 2)], "k string, v long, extra long"), 1)
    with pytest.raises(SinkError, match="column 'v'"):
        stage(sink, spark.createDataFrame([("a", "x")], "k string, v string"), 1)

    assert staged_keys(client, bucket) == before


def test_abort_and_cleanup_orphans_leave_nothing_under_staging(spark, endpoint, client, bucket, options):
    sink = make_sink(bucket, options, partition_by=["day"])
    schema = "k string, day string"
    doomed = stage(sink, spark.createDataFrame([("a", "d1"), ("b", "d2")], schema), 0)
    assert staged_keys(client, bucket)

    sink.abort(doomed)
    sink.abort(doomed)  # idempotent

    assert staged_keys(client, bucket) == []
    stage(sink, spark.createDataFrame([("c", "d1")], schema), 1)
    kept = stage(sink, spark.createDataFrame([("d", "d1")], schema), 2)
    # another job's: not ours to remove
    stage(sink, spark.createDataFrame([("x", "d1")], schema), 1, job="other")
    assert sink.cleanup_orphans("job", keep={kept.txn_id}) == 1
    assert {k.split("/")[3:5] == ["job", kept.txn_id] or k.split("/")[3] == "other"
            for k in staged_keys(client, bucket)} == {True}
    sink.abort(kept)
    assert sink.cleanup_orphans("other", keep=set()) == 1
    assert staged_keys(client, bucket) == []
    # an aborted transaction can never be committed afterwards
    with pytest.raises(SinkError, match="was aborted"):
        sink.commit(kept)
    assert sink.committed_position("job") is None

    empty = stage(sink, spark.createDataFrame([], schema), 3)
    assert empty.payload["staged"]["files"] == [] and staged_keys(client, bucket) == []
    assert sink.commit(empty).status == "committed"
    assert rows(endpoint, bucket, "k") == [] and sink.committed_position("job") == 3


# -- rewind (invariant 4) ------------------------------------------------------------------


def test_rewind_restores_the_table_and_lowers_the_transaction_version(spark, endpoint, bucket, options):
    sink = make_sink(bucket, options)
    for batch in range(3):
        sink.commit(stage(sink, spark.createDataFrame([(f"r{batch}", batch)], "k string, v long"), batch))

    sink.rewind("job", rewind_target(sink, batch=1, version=None))

    assert rows(endpoint, bucket, "k") == [{"k": "r0", "v": 0}, {"k": "r1", "v": 1}]
    assert table(endpoint, bucket).transaction_version("job") == 1
    redo = stage(sink, spark.createDataFrame([("r2", 2)], "k string, v long"), 2, generation=2)
    assert sink.commit(redo).status == "committed"
    assert [r["k"] for r in rows(endpoint, bucket, "k")] == ["r0", "r1", "r2"]

    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(f"s3://{bucket}/warehouse/t", pa.table({"k": ["foreign"], "v": [9]}), mode="append",
                    storage_options=delta_options(endpoint))
    with pytest.raises(SinkAheadError, match="was not written by job 'job'"):
        sink.rewind("job", rewind_target(sink, batch=0, version=0))
    assert len(rows(endpoint, bucket, "k")) == 4


# -- bad input and secrets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3:///t", "has no bucket"),
        ("s3://Not_A_Bucket/t", "bucket name 'Not_A_Bucket' is invalid"),
        ("hdfs://nn/t", "expected a path, file:///path or s3://bucket/path/to/table"),
    ],
)
def test_bad_uris_are_refused(uri, message):
    with pytest.raises(ConfigError, match=message) as info:
        DeltaSink(uri)
    assert repr(uri) in str(info.value)


def test_missing_credentials_or_bucket_fail_before_anything_is_written(spark, endpoint, client, bucket,
                                                                       monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sink = make_sink(bucket, {"endpoint_url": endpoint, "region_name": "us-east-1"})
    df = spark.createDataFrame([("a", 1)], "k string, v long")

    with pytest.raises(ConfigError, match=rf"uri='s3://{bucket}/warehouse/t'.*no AWS credentials found"):
        sink.validate()
    with pytest.raises(ConfigError, match="no AWS credentials found"):
        stage(sink, df, 0)
    assert keys(client, bucket, "") == []

    missing = make_sink("sp-no-such-bucket-here", {"endpoint_url": endpoint, "region_name": "us-east-1",
                                                   "aws_access_key_id": "k", "aws_secret_access_key": "s"})
    with pytest.raises(SinkError, match="sp-no-such-bucket-here"):
        missing.validate()


def test_credentials_stay_out_of_records_logs_and_the_table(spark, endpoint, client, bucket, options, caplog):
    fresh = DeltaSink(f"s3://{bucket}/warehouse/t", mode="merge", keys=["k"])  # options come with the batch
    caplog.set_level("DEBUG", logger="airflow_sparkpoint")
    record = stage(fresh, spark.createDataFrame([("a", 1)], "k string, v long"), 0, options=options)
    outcome = fresh.commit(record)

    assert SECRET not in json.dumps(record.to_json()) and SECRET not in json.dumps(outcome.detail)
    assert SECRET not in repr(fresh) and SECRET not in json.dumps(fresh.to_config())
    assert SECRET not in str(spark.sparkContext.getConf().getAll())
    assert SECRET not in caplog.text
    for key in keys(client, bucket, "warehouse/t/_delta_log/"):
        assert SECRET.encode() not in client.get_object(Bucket=bucket, Key=key)["Body"].read()
    rebuilt = sink_from_config(record.sink, record.payload["config"])
    rebuilt.configure(options)
    assert (isinstance(rebuilt, DeltaSink)
            and rebuilt.sink_id == fresh.sink_id == f"delta:s3://{bucket}/warehouse/t")
    assert rebuilt.is_committed(record) and rebuilt.commit(record).status == "already"


def test_errors_hide_the_secret_and_the_endpoint_password(endpoint, bucket):
    import traceback

    password = f"sp-endpoint-password-{uuid.uuid4().hex}"
    host = endpoint.split("://", 1)[1]
    options = {"endpoint_url": f"http://user:{password}@{host}", "region_name": "us-east-1",
               "aws_access_key_id": "sp-delta-key", "aws_secret_access_key": SECRET}
    import base64

    import pyarrow as pa

    schema = base64.b64encode(pa.schema([("k", pa.string())]).serialize().to_pybytes()).decode("ascii")
    errors: list[BaseException] = []
    for uri in (f"s3://{bucket}/warehouse/t", "s3://sp-no-such-bucket-here/t"):
        sink = DeltaSink(uri)
        sink.configure(options)
        shown = repr(sink) + str(sink) + sink.sink_id + json.dumps(sink.to_config())
        assert SECRET not in shown and password not in shown
        try:
            sink.validate()
        except Exception as exc:  # noqa: BLE001 - the missing bucket
            errors.append(exc)
        record = transaction_record(sink, 0, 1, {
            "mode": "append", "staging": "_sparkpoint_txn/job/job-b0-g1", "rows": 1,
            "files": [{"path": "_sparkpoint_txn/job/job-b0-g1/x.parquet", "size": 1, "partition_values": {},
                       "num_records": 1, "modification_time": 0}],
            "schema": schema}, created_at=0.0)
        calls: list[tuple[Any, tuple[Any, ...]]] = [
            (sink.commit, (record,)), (sink.abort, (record,)), (sink.cleanup_orphans, ("job", set()))]
        for action, args in calls:
            try:
                action(*args)
            except Exception as exc:  # noqa: BLE001 - collected and checked below
                errors.append(exc)
    assert len(errors) == 5, errors  # commit of files that are gone; every call on the missing bucket
    assert all(isinstance(e, SinkError) for e in errors), errors
    for exc in errors:
        text = "".join(traceback.format_exception(exc))
        assert SECRET not in text and password not in text, text


# -- a whole job ---------------------------------------------------------------------------


def _run(spark: Any, root: Path, endpoint: str, inputs: Path, uri: str) -> Any:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "orders",
        "spark.sparkpoint.s3.endpoint": endpoint, "spark.sparkpoint.s3.region": "us-east-1",
        "spark.sparkpoint.delta.driverStagingMaxBytes": str(DRIVER_MAX_BYTES[side()]),
    }, argv=[])
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"))
    return job.run(totals, sink=DeltaSink(uri, mode="merge", keys=["user"]), output_mode="update")


def test_a_sparkpoint_job_writes_exactly_once_to_delta_on_s3(spark, endpoint, client, bucket, tmp_path):
    """Credentials come from the environment (boto3's chain), endpoint and region from
    spark.sparkpoint.s3.*; a second run resumes from the latest checkpoint."""
    files = [[{"user": f"u{i % 3}", "amount": 10 * b + i} for i in range(6)] for b in range(5)]
    inputs, root, uri = tmp_path / "in", tmp_path / "root", f"s3://{bucket}/warehouse/orders"
    write_json_batches(inputs, files[:3])

    first = _run(spark, root, endpoint, inputs, uri)

    assert first.status == "finished"
    write_json_batches(inputs, files[3:], start=3)
    second = _run(spark, root, endpoint, inputs, uri)

    assert second.status == "finished" and second.first_batch == 3
    expected: dict[str, int] = {}
    for data in files:
        for r in data:
            expected[r["user"]] = expected.get(r["user"], 0) + r["amount"]
    assert (rows(endpoint, bucket, "user", name="orders")
            == [{"user": u, "total": t} for u, t in sorted(expected.items())])
    delta = table(endpoint, bucket, "orders")
    assert delta.transaction_version("orders") == 4
    assert [h.get("sparkpoint.batch") for h in delta.history()] == ["4", "3", "2", "1", "0"]
    assert staged_keys(client, bucket, "orders") == []
