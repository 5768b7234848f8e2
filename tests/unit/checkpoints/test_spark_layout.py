"""Names inside Spark's checkpoint location (`checkpoints.spark_layout`)."""

from __future__ import annotations

from airflow_sparkpoint.checkpoints import spark_layout


def test_log_entries_and_compactions() -> None:
    assert spark_layout.log_entry("7") == (7, False)
    assert spark_layout.log_entry(spark_layout.compact_name(9)) == (9, True)
    assert spark_layout.log_entry("7.tmp") is None
    assert spark_layout.offsets_entry(3) == "offsets/3"
    assert spark_layout.commits_entry(3) == "commits/3"


def test_state_versions() -> None:
    assert spark_layout.state_version("3.zip") == (3, "zip")
    assert spark_layout.state_version("4_0f3a-9c.changelog") == (4, "changelog")
    assert spark_layout.state_version("12.delta") == (12, "delta")
    assert spark_layout.state_version("metadata") is None


def test_both_operator_metadata_forms() -> None:
    assert spark_layout.operator_metadata(spark_layout.operator_metadata_v1("0")) == ("0", None)
    assert spark_layout.operator_metadata("state/1/_metadata/v2/5") == ("1", 5)
    assert spark_layout.operator_metadata("state/1/0/_metadata/v2/5") is None
    assert spark_layout.operator_metadata("state/0/0/1.zip") is None


def test_state_partitions_and_ssts() -> None:
    assert spark_layout.state_partition("state/2/7/left-keyToNumValues/3.delta") == (2, 7)
    assert spark_layout.state_partition("state/2/_metadata/metadata") == (2, None)
    assert spark_layout.state_partition("offsets/2") is None
    assert spark_layout.is_partition_dir("12") and not spark_layout.is_partition_dir("_metadata")
    assert spark_layout.is_rocksdb_sst("state/0/3/SSTs/000012-abc.sst")
    assert not spark_layout.is_rocksdb_sst("state/0/3/4.zip")
