"""A Python streaming data source with Kafka's offset shape, for the replay tests (#29).

No Kafka connector can be installed here, so this source stands in for one: its offset is
``{"topic": {"<partition>": <offset>}}``, as the Kafka source's, over append-only
partition files ``<path>/<topic>/<partition>.jsonl`` (one JSON record per line; a
partition's offset is its line count). A batch reads lines [start, end) of each partition,
so a batch is read again identically from its offsets, as Kafka with retention is; a
partition that appears later starts at offset 0 (as the Kafka source reads a new
partition from the earliest offset). A range that is no longer there fails the read, as
``failOnDataLoss`` does.

    spark.dataSource.register(PartitionedSource)
    spark.readStream.format("partitioned").option("path", p).option("topic", t)
         .option("maxPerPartition", "2").load()

``maxPerPartition`` caps each partition's records per batch (the default read limit).

The test writes the partitions with `append` (whose returned rows are its oracle's input);
the reader reads them with `records`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

SCHEMA = "id long, user string, amount long"
SUFFIX = ".jsonl"
#: the topic `tests/races/jobs/sink_job.py` reads
TOPIC = "events"


# ---------------------------------------------------------------------------- the data


def partition_path(path: str | Path, topic: str, partition: int) -> Path:
    return Path(path) / topic / f"{partition}{SUFFIX}"


def append(path: str | Path, topic: str, partition: int,
           rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Append `rows` to a partition (created if new); the file is replaced atomically, so a
    reader sees all of them or none. Returns the rows."""
    target = partition_path(path, topic, partition)
    target.parent.mkdir(parents=True, exist_ok=True)
    before = target.read_text() if target.exists() else ""
    tmp = target.parent / f".{target.name}.tmp"
    tmp.write_text(before + "".join(json.dumps(dict(r)) + "\n" for r in rows))
    os.replace(tmp, target)
    return [dict(r) for r in rows]


def lengths(path: str | Path, topic: str) -> dict[str, int]:
    """Each partition's offset (its line count), by partition number as a string."""
    directory = Path(path) / topic
    found: dict[str, int] = {}
    for item in sorted(directory.iterdir()) if directory.is_dir() else ():
        stem = item.name[: -len(SUFFIX)]
        if item.name.endswith(SUFFIX) and stem.isdigit():
            found[stem] = len(item.read_text().splitlines())
    return dict(sorted(found.items(), key=lambda kv: int(kv[0])))


def records(path: str | Path, topic: str, partition: int, start: int = 0,
            end: int | None = None) -> list[dict[str, Any]]:
    """Records [start, end) of a partition (to its end without `end`).

    :raises ValueError: the partition holds fewer than `end` records (data lost).
    """
    lines = partition_path(path, topic, partition).read_text().splitlines()
    end = len(lines) if end is None else end
    if len(lines) < end:
        raise ValueError(f"partition {topic}/{partition} holds {len(lines)} records; offsets [{start}, "
                         f"{end}) were asked for: its data was lost")
    return [json.loads(line) for line in lines[start:end]]


# ---------------------------------------------------------------------------- the source


@dataclass(frozen=True)
class Range(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


class PartitionedSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "partitioned"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PartitionedReader(self.options)


class PartitionedReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = options["path"]
        self.topic = options["topic"]
        self.cap = int(options["maxPerPartition"]) if "maxPerPartition" in options else None
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: no data past this

    def initialOffset(self) -> dict[str, Any]:
        return {self.topic: {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.cap) if self.cap is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = lengths(self.path, self.topic)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        now = lengths(self.path, self.topic) if self.target is None else self.target
        begun = start.get(self.topic, {})
        end = {}
        for partition, length in now.items():
            first = int(begun.get(partition, 0))
            end[partition] = min(length, first + limit.max_rows) if isinstance(limit, ReadMaxRows) else length
        return {self.topic: {**begun, **end}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begun = start.get(self.topic, {})
        return [Range(self.topic, int(p), int(begun.get(p, 0)), int(e))
                for p, e in end.get(self.topic, {}).items() if int(e) > int(begun.get(p, 0))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, Range)
        for row in records(self.path, partition.topic, partition.partition, partition.start, partition.end):
            yield int(row["id"]), str(row["user"]), int(row["amount"])
