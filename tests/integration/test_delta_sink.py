"""DeltaSink on real Spark and real Delta tables: staging is invisible, one keyed commit
per batch, repeated commits are no-ops, merge updates are exact, bad batches fail before
anything is committed, and the rewind policy of invariant 4."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError, SinkAheadError, SinkError, TransactionConflict
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.sinks import DeltaSink
from airflow_sparkpoint.sinks.base import CommittedTxn
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.delta_staging import rewind_target, stage, staging_side  # noqa: F401 - staging_side: autouse
from tests.support.records import confirm

pytestmark = pytest.mark.spark


def rows(path: Path, *order: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(),
                  key=lambda r: tuple(r[k] for k in order))


def test_append_is_invisible_until_commit_and_commits_once(spark, tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = DeltaSink(str(table), partition_by=["day"])
    df = spark.createDataFrame([("a", 1, "d1"), ("b", 2, "d2")], "k string, v long, day string")
    record = stage(sink, df, 0)
    assert not DeltaTable.is_deltatable(str(table)), "staged output must not be visible"
    assert not sink.is_committed(record)
    assert sink.commit(record).status == "committed"
    assert sink.commit(record).status == "already"  # idempotent: transaction_version says it landed
    assert sink.is_committed(record)
    assert rows(table, "k") == [{"k": "a", "v": 1, "day": "d1"}, {"k": "b", "v": 2, "day": "d2"}]
    assert DeltaTable(str(table)).metadata().partition_columns == ["day"]
    assert sink.committed_position("job") == 0
    # Spark reads the table's files back (partition directories under the staging area).
    files = DeltaTable(str(table)).file_uris()
    assert spark.read.parquet(*files).count() == 2
    # A second attempt of batch 0 from another generation is never committed, and aborting
    # it must not delete the files the table references.
    other = stage(sink, df, 0, generation=2)
    with pytest.raises(TransactionConflict,
                       match=r"by transaction job-b0-g1 \(generation 1\); transaction 'job-b0-g2'"):
        sink.commit(other)
    assert not sink.is_committed(other)
    assert not (table / other.payload["staged"]["staging"]).exists()  # the losing attempt's files are dropped
    assert (table / record.payload["staged"]["staging"]).exists()
    sink.abort(other)
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(record)  # committed: refused, files kept
    assert sink.committed_txn("job", 0) == CommittedTxn("job", 0, 1, "job-b0-g1")
    assert rows(table, "k")[0]["k"] == "a"
    assert sink.cleanup_orphans("job", keep=set()) == 0  # the committed dir is referenced
    assert DeltaTable(str(table)).version() == 0


def test_every_column_type_reads_back_the_same_from_either_staging_side(spark, tmp_path):
    import datetime as dt
    from decimal import Decimal

    from deltalake import DeltaTable

    from airflow_sparkpoint.sinks.spark_compat import collect_arrow

    schema = ("id long, name string, score double, price decimal(12,2), day date, at timestamp, ok boolean, "
              "raw binary, tags array<string>, attrs map<string,int>, point struct<x:int,y:int>, part string")
    data = [
        (1, "a", 1.5, Decimal("10.25"), dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 3, 4, 5, 6000), True,
         b"\x00\x01", ["x", "y"], {"k": 1}, (1, 2), "p 1:/"),
        (2, None, None, None, None, None, None, None, None, None, None, None),
    ]
    df = spark.createDataFrame(data, schema)
    sink = DeltaSink(str(tmp_path / "t"), partition_by=["part"])

    assert sink.commit(stage(sink, df, 0)).status == "committed"

    got = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    want = collect_arrow(df)  # DataFrame.toArrow came in Spark 4.0
    assert sorted(got.column_names) == sorted(want.column_names)
    for name in want.column_names:
        assert got.schema.field(name).type == want.schema.field(name).type, name
    by_id = sorted(got.select(want.column_names).to_pylist(), key=lambda r: r["id"])
    assert by_id == sorted(want.to_pylist(), key=lambda r: r["id"])


def test_merge_commit_that_already_landed_drops_its_staging_area(spark, tmp_path):
    """A commit step killed after the Delta log entry, before removing the merged rows'
    staging area: the repeated commit reports "already" and leaves nothing staged."""
    table = tmp_path / "t"
    sink = DeltaSink(str(table), mode="merge", keys=["k"])
    record = stage(sink, spark.createDataFrame([("a", 1)], "k string, v long"), 0)
    staging = table / record.payload["staged"]["staging"]
    parked = tmp_path / "parked"
    shutil.copytree(staging, parked)
    assert sink.commit(record).status == "committed" and not staging.exists()
    shutil.copytree(parked, staging)  # what the killed commit step left behind

    assert sink.commit(record).status == "already"

    assert not staging.exists()
    assert sink.cleanup_orphans("job", keep={record.txn_id}) == 0
    assert rows(table, "k") == [{"k": "a", "v": 1}]

    # The same through the external commit step, which finds the record still pending.
    shutil.copytree(parked, staging)
    catalog = Catalog(MemoryStorage(str(tmp_path)), "job")
    catalog.claim_generation()
    confirm(catalog, record)
    assert commit_pending(catalog)["already"] == [record.txn_id]
    assert not staging.exists() and catalog.transactions() == []
    assert rows(table, "k") == [{"k": "a", "v": 1}]


def test_merge_updates_are_exact_across_batches(spark, tmp_path):
    table = tmp_path / "t"
    sink = DeltaSink(str(table), mode="merge", keys=["user"])
    batches = [[("u1", 10), ("u2", 5)], [("u1", 15)], [("u2", 7), ("u3", 1)]]
    for batch, data in enumerate(batches):
        record = stage(sink, spark.createDataFrame(data, "user string, total long"), batch)
        assert sink.commit(record).status == "committed"
        assert sink.commit(record).status == "already"
        assert not os.path.exists(table / record.payload["staged"]["staging"]), "merged staging is removed"
    assert rows(table, "user") == [{"user": "u1", "total": 15}, {"user": "u2", "total": 7},
                                   {"user": "u3", "total": 1}]
    assert sink.committed_position("job") == 2


def test_merge_refuses_duplicate_keys_while_staging_the_batch(spark, tmp_path):
    """Before its checkpoint can complete: a batch that could never be merged must not
    become a poison batch that fails every commit after it."""
    table = tmp_path / "t"
    sink = DeltaSink(str(table), mode="merge", keys=["user", "day"])
    rows_ = [("u1", "d1", 1), ("u1", "d1", 2), ("u2", "d1", 3), ("u2", "d2", 4), ("u3", None, 5),
             ("u3", None, 6)]
    with pytest.raises(SinkError) as info:
        stage(sink, spark.createDataFrame(rows_, "user string, day string, total long"), 0)
    message = str(info.value)
    assert f"DeltaSink('{table}', mode='merge'" in message and "merge key(s) ['user', 'day']" in message
    assert "2 merge key(s)" in message and "{user='u1', day='d1'} x2" in message
    assert "{user='u3', day=None} x2" in message and "u2" not in message
    assert not (table / "_sparkpoint_txn" / "job" / "job-b0-g1").exists(), \
        "the refused batch's staging is removed"
    assert sink.committed_position("job") is None


def test_merge_keys_and_partition_columns_must_be_columns_of_the_batch(spark, tmp_path):
    for sink, named in ((DeltaSink(str(tmp_path / "m"), mode="merge", keys=["user"]), "merge keys ['user']"),
                        (DeltaSink(str(tmp_path / "a"), partition_by=["day"]), "partition_by ['day']")):
        with pytest.raises(SinkError, match=re.escape(named) + " are not columns of batch 0"):
            stage(sink, spark.createDataFrame([("u1", 1)], "name string, total long"), 0)


def test_schema_mismatch_fails_before_staging(spark, tmp_path):
    table = tmp_path / "t"
    sink = DeltaSink(str(table))
    sink.commit(stage(sink, spark.createDataFrame([("a", 1)], "k string, v long"), 0))
    with pytest.raises(SinkError, match="do not match Delta table"):
        stage(sink, spark.createDataFrame([("a", 1, 2)], "k string, v long, extra long"), 1)
    with pytest.raises(SinkError, match="column 'v'"):
        stage(sink, spark.createDataFrame([("a", "x")], "k string, v string"), 1)
    assert not os.listdir(table / "_sparkpoint_txn" / "job") or all(
        "b1" not in n for n in os.listdir(table / "_sparkpoint_txn" / "job"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uri": ""}, "uri=''"),
        ({"uri": "/x", "mode": "upsert"}, "mode='upsert'"),
        ({"uri": "/x", "mode": "merge"}, "needs keys"),
        ({"uri": "/x", "keys": ["a"]}, "only used with mode='merge'"),
        ({"uri": "gs://bucket/t"}, "expected a path, file:///path or s3://bucket/path/to/table"),
        ({"uri": "s3:///t"}, "has no bucket"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeltaSink(**kwargs)


def test_rewind_restores_the_table_and_lowers_the_transaction_version(spark, tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "t"
    sink = DeltaSink(str(table))
    for batch in range(3):
        sink.commit(stage(sink, spark.createDataFrame([(f"r{batch}", batch)], "k string, v long"), batch))
    # A snapshot at batch 1: the table goes back to right after batch 1's commit.
    sink.rewind("job", rewind_target(sink, batch=1, version=None))
    assert rows(table, "k") == [{"k": "r0", "v": 0}, {"k": "r1", "v": 1}]
    assert DeltaTable(str(table)).transaction_version("job") == 1
    # batch 2 is committed again after the rewind, exactly once
    redo = stage(sink, spark.createDataFrame([("r2", 2)], "k string, v long"), 2, generation=2)
    assert sink.commit(redo).status == "committed"
    assert [r["k"] for r in rows(table, "k")] == ["r0", "r1", "r2"]
    # A snapshot whose batch never landed rewinds to the version it recorded.
    sink.rewind("job", rewind_target(sink, batch=7, version=0))
    assert rows(table, "k") == [{"k": "r0", "v": 0}]
    assert DeltaTable(str(table)).transaction_version("job") == 0


def test_rewind_is_refused_when_another_writer_committed(spark, tmp_path):
    from deltalake import write_deltalake

    table = tmp_path / "t"
    sink = DeltaSink(str(table))
    sink.commit(stage(sink, spark.createDataFrame([("r0", 0)], "k string, v long"), 0))
    sink.commit(stage(sink, spark.createDataFrame([("r1", 1)], "k string, v long"), 1))
    import pyarrow as pa

    write_deltalake(str(table), pa.table({"k": ["foreign"], "v": [9]}), mode="append")
    with pytest.raises(SinkAheadError, match="was not written by job 'job'"):
        sink.rewind("job", rewind_target(sink, batch=0, version=0))
    with pytest.raises(SinkAheadError, match="recorded no table version"):
        sink.rewind("job", rewind_target(sink, batch=5, version=None))
    assert len(rows(table, "k")) == 3
