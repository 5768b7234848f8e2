"""The sinks' arguments and identity (issue #30, an API without surprises): column
arguments (`partition_by`, `keys`) take a name or a list the same way everywhere, and a
sink subclass is never silently settled by its base class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError, SinkError
from airflow_sparkpoint.sinks import DeltaSink, DirectorySink, S3Sink
from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, column_names, settler
from airflow_sparkpoint.sinks.resolve import resolve_sink
from tests.support.records import transaction_record


def test_column_arguments_take_a_name_or_a_list(tmp_path: Path) -> None:
    # Old code: keys="user" became ["u", "s", "e", "r"]; DirectorySink refused a string
    # partition_by and took it by keyword only.
    assert DeltaSink(str(tmp_path / "t"), mode="merge", keys="user").keys == ["user"]
    assert DeltaSink(str(tmp_path / "t"), "append", None, "day").partition_by == ["day"]
    assert DeltaSink(str(tmp_path / "t"), partition_by=("day", "hour")).partition_by == ["day", "hour"]
    assert DirectorySink(str(tmp_path / "d"), "json", "day").partition_by == ["day"]
    assert DirectorySink(str(tmp_path / "d"), partition_by=["day", "hour"]).partition_by == ["day", "hour"]
    assert DirectorySink(str(tmp_path / "d")).partition_by == []


@pytest.mark.parametrize("value", [["day", ""], 5, {"day": 1}, b"day", [None]])
def test_bad_column_arguments_name_the_sink_and_the_value(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match=r"DirectorySink partition_by="):
        DirectorySink(str(tmp_path / "d"), partition_by=value)
    with pytest.raises(ConfigError, match=r"DeltaSink partition_by="):
        DeltaSink(str(tmp_path / "t"), partition_by=value)
    with pytest.raises(ConfigError, match=r"X keys="):
        column_names("X", "keys", value)


class StagesDifferently(DeltaSink):
    """Changes staging only (a test hook, a failure injection): its base settles it."""

    def stage(self, df: Any, ctx: Any) -> dict[str, Any]:
        return super().stage(df, ctx)


class CommitsDifferently(DeltaSink):
    """Changes how a batch is committed: no other class may settle its records."""

    def commit(self, record: TransactionRecord) -> CommitOutcome:
        return super().commit(record)


def test_a_subclass_never_replaces_the_registered_class_of_its_kind() -> None:
    # Old code: defining a subclass registered it under "delta" for every later rebuild.
    registered = Sink.registered()
    assert ((registered["delta"], registered["directory"], registered["s3"])
            == (DeltaSink, DirectorySink, S3Sink))


def test_a_subclass_that_settles_differently_is_never_rebuilt_as_its_base(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    assert settler(DeltaSink(table)) == {} and settler(StagesDifferently(table)) == {}
    sink = StagesDifferently(table)
    # as before
    assert (type(resolve_sink(transaction_record(sink, 3, 2, job="orders", **settler(sink)),
                              None)) is DeltaSink)

    own = CommitsDifferently(table)
    record = transaction_record(own, 3, 2, job="orders", **settler(own))  # as the runtime writes it
    assert record.payload["settled_by"] == f"{__name__}.CommitsDifferently"
    # Old code: the commit step rebuilt a plain DeltaSink and committed through it.
    with pytest.raises(SinkError, match=r"staged by sink class .*CommitsDifferently.*refused") as info:
        resolve_sink(record, None)
    assert "SparkpointCommitOperator(sink=" in str(info.value)
    with pytest.raises(SinkError, match="CommitsDifferently"):
        resolve_sink(record, DeltaSink(table))  # declared, but the base class
    assert resolve_sink(record, own) is own
