"""Stateful pipelines on known input, and the state each must hold afterwards computed
from that input in plain Python (the oracles of the inspect / verify tests).

Every case writes one JSON file per micro-batch (`tests.support.inputs.write_json_batches`)
and runs through `SparkpointJob` into a Delta table. `expected` maps the store names that
`airflow_sparkpoint.runtime.state_inspect` reports to the rows as JSON would show them:
``{(key tuple, map key tuple or None): value tuple}`` (list state: a sorted list of
element tuples per key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.support.paths import REPO, load_module

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ts(minute: float) -> str:
    return (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")


def json_ts(minute: float) -> str:
    """A timestamp as the inspect rows show it (session time zone UTC)."""
    return (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


def micros(minute: float) -> int:
    return int((T0 + timedelta(minutes=minute)).timestamp() * 1_000_000)


def threshold_module() -> Any:
    """``dags/jobs/threshold_alerts.py`` (not a package: loaded from its path)."""
    return load_module("sparkpoint_threshold_alerts", REPO / "dags/jobs/threshold_alerts.py")


@dataclass
class Case:
    build: Callable[[Any, Path], Any]
    files: list[list[dict[str, Any]]]
    sink: dict[str, Any]
    output_mode: str
    operator: str  # Spark's operator name in state-metadata
    expected: dict[str, Any] = field(default_factory=dict)  # store -> {(key, map_key): value}
    types: dict[str, str] = field(default_factory=dict)  # store -> type


def run_case(spark: Any, case: Case, root: str, job: str, inputs: Path, table: Path, *,
             restore: str = "latest", conf: dict[str, str] | None = None) -> Any:
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    sp = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": root, "spark.sparkpoint.job": job, "spark.sparkpoint.restore": restore,
        **(conf or {}),
    }, argv=[])
    return sp.run(case.build(spark, inputs), sink=DeltaSink(str(table), **case.sink),
                  output_mode=case.output_mode)


def run_job(spark: Any, root: Path, job: str, build: Callable[[Any, Path], Any], inputs: Path, table: Path,
            sink_kwargs: dict[str, Any], output_mode: str, restore: str = "latest",
            state_store: str = "rocksdb", ) -> Any:
    """Run `build` over `inputs` as job `job` under `root` into the Delta table `table`
    (DeltaSink(**sink_kwargs)), restoring `restore`, with `state_store`; the run's result."""
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    sp = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": job, "spark.sparkpoint.restore": restore,
        "spark.sparkpoint.stateStore": state_store,
    }, argv=[])
    return sp.run(build(spark, inputs), sink=DeltaSink(str(table), **sink_kwargs), output_mode=output_mode)


def table_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the Delta table at `path`, in the order of their JSON."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


# ------------------------------------------------------------------ aggregation


def aggregation(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    return events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("n"))


def aggregation_case() -> Case:
    # u3 only appears in the last file; amounts differ per file and user
    files = [[{"user": f"u{u}", "amount": i * 10 + u} for u in range(3 if i < 3 else 4)] for i in range(4)]
    state: dict[Any, Any] = {}
    for rows in files:
        for r in rows:
            total, n = state.get(((r["user"],), None), (0, 0))
            state[((r["user"],), None)] = (total + r["amount"], n + 1)
    return Case(aggregation, files, {"mode": "merge", "keys": ["user"]}, "update", "stateStoreSave",
                {"default": state}, {"default": "state"})


# ------------------------------------------------------------------ deduplication


def deduplication(spark: Any, inputs: Path) -> Any:
    events = (
        spark.readStream.schema("id string, ts timestamp, v long").option("maxFilesPerTrigger", 1)
        .json(str(inputs))
    )
    return events.withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["id"])


def deduplication_case() -> Case:
    # ids repeat across files (never within one); the state keeps each id's first
    # event time plus the watermark delay, and nothing is evicted (the delay is an hour)
    files = [[{"id": f"e{(i * 2 + j) % 5}", "ts": ts(i), "v": i * 10 + j} for j in range(2)]
             for i in range(4)]
    first: dict[str, int] = {}
    for i, rows in enumerate(files):
        for r in rows:
            first.setdefault(r["id"], i)
    state = {((ident,), None): (micros(minute) + 3_600_000_000,) for ident, minute in first.items()}
    return Case(deduplication, files, {"mode": "append"}, "append", "dedupeWithinWatermark",
                {"default": state}, {"default": "state"})


# ------------------------------------------------------------------ stream-stream join


def stream_join(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    def side(name: str) -> Any:
        return (spark.readStream.schema("id string, ts timestamp, side string, v long")
                .option("maxFilesPerTrigger", 1).json(str(inputs)).where(f"side = '{name}'"))

    left = side("L").select(F.col("id"), F.col("ts").alias("lts"), F.col("v").alias("lv")) \
        .withWatermark("lts", "1 hour")
    right = side("R").select(F.col("id").alias("rid"), F.col("ts").alias("rts"), F.col("v").alias("rv")) \
        .withWatermark("rts", "1 hour")
    return left.join(right,
                     F.expr("id = rid AND rts BETWEEN lts - interval 1 hour AND lts + interval 1 hour"))


def stream_join_case() -> Case:
    # each left row's partner arrives two files later; both sides stay buffered (1 h)
    files = [[{"id": f"k{i}", "ts": ts(i), "side": "L", "v": i},
              {"id": f"k{i - 2}", "ts": ts(i), "side": "R", "v": -i}] for i in range(4)]
    left: dict[Any, Any] = {}
    right: dict[Any, Any] = {}
    for i, rows in enumerate(files):
        for r in rows:
            target = left if r["side"] == "L" else right
            target[((r["id"],), None)] = (r["id"], json_ts(i), r["v"])
    return Case(stream_join, files, {"mode": "append"}, "append", "symmetricHashJoin",
                {"left": left, "right": right}, {"left": "join", "right": "join"})


# ------------------------------------------------------------------ transformWithState: value, list, map


def keyed_state(spark: Any, inputs: Path) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class RunningTotals(StatefulProcessor):
        """ValueState (running total), ListState (last 3 amounts), MapState (count per tag)."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "total long")
            self.recent = handle.getListState("recent", "amount long")
            self.tags = handle.getMapState("tags", "tag string", "count long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            total = self.total.get()[0] if self.total.exists() else 0
            recent = [r[0] for r in self.recent.get()] if self.recent.exists() else []
            for frame in rows:
                for amount, tag in zip(frame["amount"], frame["tag"]):
                    total += int(amount)
                    recent = (recent + [int(amount)])[-3:]
                    count = self.tags.getValue((tag,))[0] if self.tags.containsKey((tag,)) else 0
                    self.tags.updateValue((tag,), (count + 1,))
            self.total.update((total,))
            self.recent.put([(a,) for a in recent])
            yield pd.DataFrame({"user": [key[0]], "total": [total]})

        def close(self) -> None:
            pass

    events = (spark.readStream.schema("user string, amount long, tag string").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    return events.groupBy("user").transformWithStateInPandas(
        statefulProcessor=RunningTotals(), outputStructType="user string, total long",
        outputMode="Update", timeMode="None",
    )


def keyed_state_case() -> Case:
    # one event per user and file (the processor's "recent" order is then the file order)
    files = [[{"user": f"u{u}", "amount": i + u * 100, "tag": "abc"[(i + u) % 3]}
              for u in range(3 if i else 2)]
             for i in range(5)]
    totals: dict[Any, Any] = {}
    recent: dict[str, list[int]] = {}
    tags: dict[Any, Any] = {}
    for rows in files:
        for r in rows:
            user = r["user"]
            totals[((user,), None)] = (totals.get(((user,), None), (0,))[0] + r["amount"],)
            recent[user] = (recent.get(user, []) + [r["amount"]])[-3:]
            tags[((user,), (r["tag"],))] = (tags.get(((user,), (r["tag"],)), (0,))[0] + 1,)
    lists = {((user,), None): sorted((a,) for a in amounts) for user, amounts in recent.items()}
    return Case(keyed_state, files, {"mode": "merge", "keys": ["user"]}, "update",
                "transformWithStateInPandasExec",
                {"total": totals, "recent": lists, "tags": tags},
                {"total": "value", "recent": "list", "tags": "map"})


# ------------------------------------------------------------------ threshold alerts (the seed pipeline)

LIMIT = 90.0
READINGS = 3


def threshold_query(state_ttl_ms: int | None = None, files_per_batch: int = 1) -> Callable[[Any, Path], Any]:
    module = threshold_module()

    def build(spark: Any, inputs: Path) -> Any:
        return module.build_query(spark, str(inputs), limit=LIMIT, readings=READINGS,
                                  files_per_batch=files_per_batch, state_ttl_ms=state_ttl_ms)

    return build


def threshold_files() -> list[list[dict[str, Any]]]:
    """Four sensors over four files: s0 alerts twice, s1 once and keeps a partial streak,
    s2 never goes over the limit, s3 keeps a streak broken before it alerts."""
    values = {
        "s0": [95, 96, 97, 98, 99, 91, 50, 92],
        "s1": [80, 93, 94, 95, 96, 50, 97, 98],
        "s2": [10, 20, 30, 40, 50, 60, 70, 80],
        "s3": [91, 92, 50, 93, 94, 10, 95, 96],
    }
    files = []
    for i in range(4):  # two readings per sensor and file
        files.append([{"sensor": s, "ts": ts(i * 2 + j), "value": float(v[i * 2 + j])}
                      for s, v in values.items() for j in range(2)])
    return files


def threshold_state(files: list[list[dict[str, Any]]]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """(over_limit, alerts) after `files`, by the rules of ``threshold_alerts.py``."""
    buffers: dict[str, list[tuple[str, float]]] = {}
    alerts: dict[str, int] = {}
    for rows in files:
        for r in sorted(rows, key=lambda r: r["ts"]):
            sensor = r["sensor"]
            buffer = buffers.get(sensor, [])
            if r["value"] <= LIMIT:
                buffers[sensor] = []
                continue
            buffer = buffer + [(r["ts"], r["value"])]
            if len(buffer) == READINGS:
                alerts[sensor] = alerts.get(sensor, 0) + 1
                buffer = []
            buffers[sensor] = buffer
    over = {((s,), None): sorted((_as_json_ts(t), v) for t, v in b) for s, b in buffers.items() if b}
    counts = {((s,), None): (n,) for s, n in alerts.items()}
    return over, counts


def _as_json_ts(text: str) -> str:
    return text.replace("Z", ".000000Z")


def threshold_case() -> Case:
    files = threshold_files()
    over, alerts = threshold_state(files)
    return Case(threshold_query(), files, {"mode": "append"}, "append", "transformWithStateInPandasExec",
                {"over_limit": over, "alerts": alerts}, {"over_limit": "list", "alerts": "value"})


CASES: dict[str, Callable[[], Case]] = {
    "aggregation": aggregation_case,
    "dropDuplicates": deduplication_case,
    "stream-stream join": stream_join_case,
    "transformWithState value/list/map": keyed_state_case,
    "threshold alerts (list + value)": threshold_case,
}


# ------------------------------------------------------------------ comparing


def observed(rows: list[dict[str, Any]], store_type: str) -> dict[Any, Any]:
    """Inspect's JSON rows in the oracle's shape."""
    result: dict[Any, Any] = {}
    for row in rows:
        key = tuple(row["key"].values())
        if store_type == "list":
            result.setdefault((key, None), []).append(tuple(row["value"].values()))
        elif store_type == "map":
            result[(key, tuple(row["map_key"].values()))] = tuple(row["value"].values())
        else:
            assert (key, None) not in result, f"key {key} appears twice"
            result[(key, None)] = tuple(row["value"].values())
    return {k: sorted(v) if isinstance(v, list) else v for k, v in result.items()}


def row_count(expected: dict[Any, Any]) -> int:
    return sum(len(v) if isinstance(v, list) else 1 for v in expected.values())


def key_count(expected: dict[Any, Any]) -> int:
    return len({key for key, _ in expected})


def threshold_alerts(files: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The alert rows ``threshold_alerts.py`` emits for each file (one batch per file)."""
    buffers: dict[str, list[tuple[str, float]]] = {}
    emitted = []
    for rows in files:
        alerts = []
        for r in sorted(rows, key=lambda r: r["ts"]):
            buffer = buffers.get(r["sensor"], [])
            if r["value"] <= LIMIT:
                buffers[r["sensor"]] = []
                continue
            buffer = buffer + [(r["ts"], r["value"])]
            if len(buffer) == READINGS:
                alerts.append({"sensor": r["sensor"], "first_ts": buffer[0][0], "last_ts": buffer[-1][0],
                               "readings": READINGS, "peak": max(v for _, v in buffer)})
                buffer = []
            buffers[r["sensor"]] = buffer
        emitted.append(alerts)
    return emitted
