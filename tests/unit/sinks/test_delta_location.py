"""Where a `DeltaSink` table lives: URI parsing, the delta-rs options of an S3 table
(conditional put, never unsafe rename, credentials from boto3's chain) and the executor
helpers. No Spark, no network."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks._delta_location import LocalTable, S3Table, table_location
from airflow_sparkpoint.sinks._delta_stage import DeltaStageSpec, StageLayout, escape_partition_value
from airflow_sparkpoint.sinks.delta import DeltaSink

SECRET = "sp-unit-secret-value"


@pytest.mark.parametrize(
    ("uri", "kind", "location"),
    [
        ("rel/table", LocalTable, None),
        ("file:///data/my%20table", LocalTable, "/data/my table"),
        ("s3://bucket-1/a/b/", S3Table, "s3://bucket-1/a/b"),
        ("s3a://bucket-1/a/b", S3Table, "s3://bucket-1/a/b"),
        ("s3://bucket-1", S3Table, "s3://bucket-1"),
    ],
)
def test_table_location_by_scheme(uri, kind, location, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = table_location(uri)
    assert isinstance(found, kind)
    assert found.uri == (location if location is not None else str(tmp_path / "rel" / "table"))


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3:///t", "has no bucket"),
        ("s3://UPPER/t", "bucket name 'UPPER' is invalid"),
        ("gs://b/t", "expected a path, file:///path or s3://bucket/path/to/table"),
        ("memory://x/t", "has scheme 'memory'"),
    ],
)
def test_bad_uris_name_the_value(uri, message):
    with pytest.raises(ConfigError, match=message) as info:
        table_location(uri)
    assert repr(uri) in str(info.value)


def test_sink_identity_of_an_s3_table():
    sink = DeltaSink("s3a://bucket-1/w/t", mode="merge", keys=["k"])
    assert sink.path == "s3://bucket-1/w/t" and sink.sink_id == "delta:s3://bucket-1/w/t"
    assert (sink.to_config()
            == {"uri": "s3a://bucket-1/w/t", "mode": "merge", "keys": ["k"], "partition_by": []})


def test_delta_options_use_conditional_put_and_never_unsafe_rename(monkeypatch):
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")  # the environment cannot switch it on
    location = table_location("s3://bucket-1/w/t")
    location.configure({"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                        "aws_access_key_id": "key", "aws_secret_access_key": SECRET,
                        "aws_session_token": "tok"})

    options = location.delta_options()

    assert options == {
        "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
        "conditional_put": "etag", "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
    }
    assert location.scrub(f"failed with {SECRET} and tok") == "failed with *** and ***"
    assert SECRET not in repr(location.__dict__.get("_store"))


def test_credentials_come_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    location = table_location("s3://bucket-1/w/t")
    location.configure({"endpoint_url": "https://minio.example:9000"})

    options = location.delta_options()

    assert options["AWS_ACCESS_KEY_ID"] == "env-key" and options["AWS_SECRET_ACCESS_KEY"] == "env-secret"
    assert "AWS_ALLOW_HTTP" not in options and "AWS_SESSION_TOKEN" not in options


def test_missing_credentials_are_a_config_error(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sink = DeltaSink("s3://bucket-1/w/t")
    sink.configure({"endpoint_url": "http://127.0.0.1:9"})

    with pytest.raises(ConfigError,
                       match=r"uri='s3://bucket-1/w/t'.*no AWS credentials found for bucket 'bucket-1'"):
        sink.validate()


def test_partition_directories_are_escaped_as_spark_does():
    assert escape_partition_value("d1") == "d1"
    assert escape_partition_value("a b:c/d=e%") == "a b%3Ac%2Fd%3De%25"
    assert escape_partition_value(None) == escape_partition_value("") == "__HIVE_DEFAULT_PARTITION__"
    layout = StageLayout("_sparkpoint_txn/job/job-b0-g1", "abc", ("day", "h"))
    spec = DeltaStageSpec(layout, "b", "w/t/", {"secret": SECRET})
    assert spec.layout.relative_path(3, ("d1", None), 2) == (
        "_sparkpoint_txn/job/job-b0-g1/day=d1/h=__HIVE_DEFAULT_PARTITION__/part-00003-abc-002.snappy.parquet")
    assert SECRET not in repr(spec)


def test_read_table_returns_the_rows_with_the_tables_own_types(tmp_path):
    import datetime

    import deltalake
    import pyarrow as pa

    from airflow_sparkpoint.sinks.delta_rows import read_table

    ts = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    first = pa.table({"user": ["a", "b"], "total": pa.array([1, 2], pa.int64()),
                      "ts": pa.array([ts, ts], pa.timestamp("us", "UTC")), "day": ["d1", "d2"]})
    deltalake.write_deltalake(str(tmp_path), first, partition_by=["day"])
    deltalake.write_deltalake(str(tmp_path), first.slice(0, 1).set_column(0, "user", pa.array(["c"])),
                              mode="append")
    table = deltalake.DeltaTable(str(tmp_path))

    got = read_table(table)
    assert got.schema == pa.schema(table.schema().to_arrow())  # strings, not delta-rs' string views
    assert sorted((r["user"], r["total"], r["ts"], r["day"]) for r in got.to_pylist()) == [
        ("a", 1, ts, "d1"), ("b", 2, ts, "d2"), ("c", 1, ts, "d1")]
    assert read_table(table, ["total", "user"]).column_names == ["total", "user"]
    at_version_0 = read_table(deltalake.DeltaTable(str(tmp_path), version=0)).to_pylist()
    assert sorted(r["user"] for r in at_version_0) == ["a", "b"]
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the Delta table .* it has \['user'"):
        read_table(table, ["nope"])


def test_open_brings_this_threads_handle_up_to_date(tmp_path):
    """The handle is reused and sees another writer's commit; another thread has its own."""
    import threading

    import deltalake
    import pyarrow as pa

    path = str(tmp_path / "t")
    deltalake.write_deltalake(path, pa.table({"k": [1]}))
    location = table_location(path)
    first = location.open()
    deltalake.write_deltalake(path, pa.table({"k": [2]}), mode="append")  # another writer
    again = location.open()
    assert again is first and again.version() == 1
    assert sorted(again.to_pyarrow_table()["k"].to_pylist()) == [1, 2]
    other: list = []
    thread = threading.Thread(target=lambda: other.append(location.open()))
    thread.start()
    thread.join()
    assert other[0] is not first and other[0].version() == 1


def test_open_after_the_table_was_deleted_or_replaced_reads_the_location_again(tmp_path):
    """A handle whose newest commit left the log is not trusted: a deleted table is None,
    a table recreated with fewer commits is read afresh (its own schema and rows)."""
    import shutil

    import deltalake
    import pyarrow as pa

    path = str(tmp_path / "t")
    deltalake.write_deltalake(path, pa.table({"k": [1]}))
    deltalake.write_deltalake(path, pa.table({"k": [2]}), mode="append")
    location = table_location(path)
    assert location.open().version() == 1
    shutil.rmtree(path)
    assert location.open() is None
    deltalake.write_deltalake(path, pa.table({"k": [1]}))
    deltalake.write_deltalake(path, pa.table({"k": [2]}), mode="append")
    assert location.open().version() == 1
    shutil.rmtree(path)
    deltalake.write_deltalake(path, pa.table({"other": ["x"]}))  # replaced, with one commit
    replaced = location.open()
    assert replaced.version() == 0 and replaced.schema().to_arrow().names == ["other"]
