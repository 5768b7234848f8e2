"""The small model of Spark the simulated drivers run instead of a JVM.

A file source with ``maxFilesPerTrigger=1`` over the input files ``f0000.jsonl``... in
name order, and one stateful operator keeping a running sum:

* batch N plans its input by writing ``sources/0/N`` (the next input file after the last
  one logged) and ``offsets/N`` (``{"logOffset": N}``), as Spark's file source does; a
  batch whose ``offsets/N`` exists without ``commits/N`` (its run died) runs again with
  the same input;
* its rows are the file's lines, each ``value = amount * version`` (the job code's
  version: blue and green differ), with the running ``sum`` over the lineage's batches
  and tags naming the batch and the generation that produced them;
* the state after batch N is ``state/0/0/<N+1>.snapshot`` (a full snapshot per version:
  what the HDFS-backed provider may write), written when the sink consumes the batch;
  then ``commits/N``.

Replay (`runtime.replay.run_batch`, Spark's own execution of one planned batch) is the
same batch execution without a sink. The staged rows of the two sinks are written the
way their Spark writers would lay them out; everything else is the sinks' real code.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints import spark_layout
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.sinks import DeltaSink, DirectorySink, _delta_schema
from airflow_sparkpoint.sinks import directory as directory_module
from airflow_sparkpoint.sinks.base import StageContext

#: the rows of every input file: (key, amount) pairs, a pure function of the file index
ROWS_PER_FILE = 2
COLUMNS = ("batch", "line", "key", "value", "sum", "generation", "version")
#: the sink kinds on a Delta table: an append, a merge by (batch, line)
DELTA_KINDS = ("delta", "delta-merge")


def input_rows(index: int) -> list[dict[str, int]]:
    """The lines of input file `index` (the oracle reads these too)."""
    return [{"key": (index + line) % 3, "amount": 10 * index + line + 1} for line in range(ROWS_PER_FILE)]


def write_inputs(directory: str, count: int) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(count):
        path = os.path.join(directory, f"f{index:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(row) + "\n" for row in input_rows(index)))
        paths.append(path)
    return paths


def read_input(path: str) -> list[dict[str, int]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def file_index(path: str) -> int:
    return int(os.path.basename(path)[1:5])


# ---------------------------------------------------------------------------- the query


@dataclass
class ModelFrame:
    """A micro-batch's DataFrame: its rows, and what consuming it does (the stateful
    operator's state commit)."""

    batch: int
    rows: list[dict[str, Any]]
    on_consumed: Callable[[], None]
    consumed: bool = False

    def consume(self) -> list[dict[str, Any]]:
        if not self.consumed:
            self.consumed = True
            self.on_consumed()
        return self.rows


@dataclass
class ModelQuery:
    """The streaming query over a live location (see the module docstring)."""

    live: str
    inputs: list[str]
    version: int
    generation: int
    point: Callable[[str], None]
    stopped: bool = False
    _planned: dict[int, str] = field(default_factory=dict)

    def stop(self) -> None:
        self.stopped = True

    # -- Spark's logs -----------------------------------------------------------------

    def _path(self, rel: str) -> str:
        return os.path.join(self.live, *rel.split("/"))

    def _write(self, rel: str, text: str) -> None:
        self.point(f"live.write {rel}")
        path = self._path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)

    def _read(self, rel: str) -> str | None:
        try:
            with open(self._path(rel), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def _source_file(self, batch: int) -> str | None:
        """The input file ``sources/0/<batch>`` names (the batch's planned input)."""
        text = self._read(f"{spark_layout.SOURCES}/0/{batch}")
        if text is None:
            return None
        lines = [line for line in text.split("\n")[1:] if line.strip()]
        return str(json.loads(lines[0])["path"]).removeprefix("file://") if lines else None

    def next_batch(self) -> int | None:
        """Plan the next batch (or find the planned one a dead run left); None when drained."""
        if not os.path.isfile(self._path("metadata")):
            self._write("metadata", json.dumps({"id": str(uuid.uuid4())}) + "\n")
        last = livedir.last_commit(self.live)
        batch = 0 if last is None else last + 1
        if self._read(spark_layout.offsets_entry(batch)) is not None and self._source_file(batch) is not None:
            return batch  # planned by a run that died before committing it: the same input again
        previous = self._source_file(batch - 1) if batch > 0 else None
        after = -1 if previous is None else file_index(previous)
        remaining = [p for p in self.inputs if file_index(p) > after]
        if not remaining:
            return None
        entry = json.dumps({"path": "file://" + remaining[0], "timestamp": 0, "batchId": batch})
        self._write(f"{spark_layout.SOURCES}/0/{batch}", f"v1\n{entry}")
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
        self._write(spark_layout.offsets_entry(batch), f"v1\n{meta}\n" + json.dumps({"logOffset": batch}))
        return batch

    def frame(self, batch: int) -> ModelFrame:
        """Batch `batch`'s rows from its planned input and the state after batch-1."""
        path = self._source_file(batch)
        if path is None:
            raise RuntimeError(f"model: batch {batch} has no planned input in {self.live}")
        state = self._state(batch)
        total = state["sum"]
        rows = []
        for line, row in enumerate(read_input(path)):
            value = row["amount"] * self.version
            total += value
            rows.append({"batch": batch, "line": line, "key": row["key"], "value": value, "sum": total,
                         "generation": self.generation, "version": self.version})

        def commit_state() -> None:
            self._write(f"{spark_layout.STATE}/0/0/{batch + 1}.snapshot",
                        json.dumps({"sum": total, "batches": state["batches"] + 1}))

        return ModelFrame(batch, rows, commit_state)

    def _state(self, batch: int) -> dict[str, int]:
        if batch == 0:
            return {"sum": 0, "batches": 0}
        text = self._read(f"{spark_layout.STATE}/0/0/{batch}.snapshot")
        if text is None:
            raise RuntimeError(f"model: state version {batch} is missing in {self.live} "
                               "(restored state incomplete)")
        state = json.loads(text)
        if state["batches"] != batch:
            raise RuntimeError(f"model: state version {batch} in {self.live} counts "
                               f"{state['batches']} batches")
        return {"sum": int(state["sum"]), "batches": int(state["batches"])}

    def commit(self, batch: int) -> None:
        self._write(spark_layout.commits_entry(batch), "v1\n{\"nextBatchWatermarkMs\":0}")

    def replay(self, batch: int) -> None:
        """`replay.run_batch`: execute planned batch `batch` without a sink."""
        frame = self.frame(batch)
        frame.consume()
        self.commit(batch)


# ---------------------------------------------------------------------------- staging


def _stage_point(sink: Any, label: str) -> None:
    point = getattr(sink, "sim_point", None)
    if point is not None:
        point(label)


class SimDirectorySink(DirectorySink):
    """`DirectorySink` whose staging writes the model's rows as Spark's JSON writer would
    (one ``part-00000-<uuid>-c000.json`` per batch under ``_staging/<txn>``); commit, abort,
    claims and everything else are the sink's own."""

    sim_point: Callable[[str], None] | None = None

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:
        rows = df.consume()
        staging = self._staging_key(ctx.txn_id)
        assert self._local is not None
        target = os.path.join(self._local, *staging.split("/"))
        _stage_point(self, f"sink.stage {staging}")
        if os.path.isdir(target):
            for name in os.listdir(target):
                os.unlink(os.path.join(target, name))
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, f"part-00000-{uuid.uuid4()}-c000.json"), "w",
                  encoding="utf-8") as handle:
            handle.write("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
        with self._root() as root:
            files = directory_module._data_files(root, staging)
        return {"format": self.format, "staging": staging, "files": files,
                "bytes": sum(f["size"] for f in files)}


class SimDeltaSink(DeltaSink):
    """`DeltaSink` whose staging writes the model's rows as parquet the way the driver's
    staging does (`_delta_stage.PartitionWriter`); commit, abort, rewind are the sink's own."""

    sim_point: Callable[[str], None] | None = None

    def stage(self, df: Any, ctx: StageContext) -> dict[str, Any]:
        import base64

        import pyarrow as pa

        from airflow_sparkpoint.sinks._delta_stage import PartitionWriter, StageLayout

        rows = df.consume()
        schema = pa.schema([(c, pa.int64()) for c in COLUMNS])
        table = pa.Table.from_pylist(rows, schema=schema)
        _delta_schema.check_schema(self._table(), schema, self.uri)
        staging = self._staging_dir(ctx.job, ctx.txn_id)
        _stage_point(self, f"sink.stage {staging}")
        self.location.reset(staging)
        layout = StageLayout(staging, uuid.uuid4().hex[:16], ())
        root = self.location.uri
        scratch = os.path.join(root, *staging.split("/"), f".tmp-{layout.attempt}")
        os.makedirs(scratch)

        def put(local: str, rel: str) -> None:
            final = os.path.join(root, *rel.split("/"))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(local, final)

        writer = PartitionWriter((), scratch)
        try:
            writer.write(table)
        finally:
            writer.close()
        files = sorted(writer.place(layout, 0, put), key=lambda f: f["path"])
        os.rmdir(scratch)
        return {"mode": self.mode, "staging": staging, "files": files, "rows": len(rows),
                "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}


def visible_rows(sink: Any) -> list[dict[str, Any]]:
    """Every row a reader of the sink sees now (the oracle compares them)."""
    if isinstance(sink, DeltaSink):
        table = sink._table()
        if table is None:
            return []
        from airflow_sparkpoint.sinks.delta_rows import read_table

        return [dict(row) for row in read_table(table).to_pylist()]
    assert isinstance(sink, DirectorySink) and sink._local is not None
    rows: list[dict[str, Any]] = []
    for directory, dirs, files in os.walk(sink._local):
        dirs[:] = [d for d in dirs if not directory_module._is_hidden(d)]
        for name in files:
            if directory_module._is_hidden(name) or not name.endswith(".json"):
                continue
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                rows += [json.loads(line) for line in handle if line.strip()]
    return rows


def visible_signature(sink: Any) -> tuple[tuple[str, int, int, int], ...]:
    """What `visible_rows` of a directory sink reads, as (path, inode, size, modification
    time) of each file it reads: the same signature, the same rows (the check after every
    step reads them again only when it changed)."""
    assert isinstance(sink, DirectorySink) and sink._local is not None
    found = []
    pending = [sink._local]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except FileNotFoundError:  # as os.walk in visible_rows: gone is empty
            continue
        for entry in entries:
            if directory_module._is_hidden(entry.name):
                continue
            if entry.is_dir():
                pending.append(entry.path)
            elif entry.name.endswith(".json"):
                st = entry.stat()
                found.append((entry.path, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def expected_rows(batches: Mapping[int, int]) -> list[dict[str, Any]]:
    """The rows of batches 0..K (`batches`: batch -> the code version that ran it) of
    one lineage, computed from the input alone: the oracle."""
    rows = []
    total = 0
    for batch in range(len(batches)):
        version = batches[batch]
        for line, row in enumerate(input_rows(batch)):
            value = row["amount"] * version
            total += value
            rows.append({"batch": batch, "line": line, "key": row["key"], "value": value, "sum": total,
                         "version": version})
    return rows
