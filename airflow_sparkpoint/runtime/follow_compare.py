"""The comparison gate of a shadow in compare mode (`runtime.follow`, #49): the rows
green's code made of blue's batch b against the rows blue committed for b.

Blue's rows of a batch are the files its commit of that batch added: a `DeltaSink` in
append mode (the files of the table version that holds the batch's app transaction) or
a `DirectorySink` (the files its claim of the batch names). A merge sink's batch rows are
gone once merged, so its table state would have to be compared instead: refused up
front, as is any other sink. Rows compare as multisets (``exceptAll`` both ways) over
green's columns; non-deterministic queries (``rand()``, ``uuid()``, wall clock) always
differ, and sums of doubles may differ in their last bits with another partitioning:
the gate is for deploys that must not change results.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.sinks.delta import DeltaSink
from airflow_sparkpoint.sinks.directory import DirectorySink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ROWS_SHOWN", "blue_rows", "check_comparable", "difference"]

#: rows of each side a difference names
ROWS_SHOWN = 5


def check_comparable(sink: Sink) -> None:
    """:raises ConfigError: blue's batches cannot be read back from `sink` one by one."""
    if isinstance(sink, DeltaSink) and sink.mode == "append":
        return
    if type(sink) is DirectorySink:
        return
    raise ConfigError(f"spark.sparkpoint.shadow.mode=compare cannot read blue's batches back from "
                      f"{sink!r}; expected DeltaSink(mode='append') or DirectorySink (a merge sink's batch "
                      "rows are gone once merged); use shadow.mode=discard")


def blue_rows(spark: SparkSession, sink: Sink, job: str, batch: int) -> DataFrame | None:
    """The rows blue's commit of `batch` added to `sink`, or None when it has no commit
    yet (`check_comparable` sinks only)."""
    if isinstance(sink, DeltaSink):
        files = sink.batch_files(job, batch)
        if files is None:
            return None
        return spark.read.parquet(*files) if files else None
    assert isinstance(sink, DirectorySink)
    files = sink.batch_files(job, batch)
    if files is None:
        return None
    if not files:
        return None
    return spark.read.option("basePath", sink.uri).format(sink.format).options(**sink.options).load(*files)


def difference(green: DataFrame | None, blue: DataFrame | None, batch: int) -> str | None:
    """What differs between green's and blue's rows of `batch` (None: an empty batch), in
    words with the first `ROWS_SHOWN` rows of each side that the other lacks; None when
    they are equal multisets."""
    if green is None and blue is None:
        return None
    if green is None or blue is None:
        side, rows = ("blue", blue) if green is None else ("green", green)
        assert rows is not None
        shown = _rows(rows.limit(ROWS_SHOWN))
        if not shown:
            return None
        return f"batch {batch}: only {side} has rows, e.g. {json.dumps(shown, default=str)}"
    columns = green.columns
    if sorted(columns) != sorted(blue.columns):
        return (f"batch {batch}: green's columns {sorted(columns)} differ from the columns blue committed "
                f"{sorted(blue.columns)}")
    blue = blue.select(*columns)
    only_green = _rows(green.exceptAll(blue).limit(ROWS_SHOWN))
    only_blue = _rows(blue.exceptAll(green).limit(ROWS_SHOWN))
    if not only_green and not only_blue:
        return None
    return (f"batch {batch}: rows only green has: {json.dumps(only_green, default=str)}; rows only blue "
            f"committed: {json.dumps(only_blue, default=str)}")


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]
