"""Incremental checkpoints: bytes a retained checkpoint copies ÷ the total size of the
state it describes, when ≤ 5 % of the keys change per batch (a target of docs/BENCHMARKS.md).

A stateful query (running total per key, RocksDB with changelog checkpointing, Spark's
state store maintenance every ``--maintenance`` so that RocksDB snapshots and their SST
files are uploaded during the run) first loads ``--keys`` keys, then updates a random
``--change`` fraction of them per batch; Sparkpoint takes a retained checkpoint after
every batch (numRetained large enough to keep them all). Each checkpoint's
`SnapshotStats` (read back from the catalog) gives bytes copied and total bytes.

The headline is the median over the checkpoints after the first (which necessarily
copies everything); the mean (amortized, snapshot uploads included) and the maximum are
reported too. Target: median ≤ 0.10. The growth curve repeats the run for smaller key
counts: state size vs bytes per checkpoint.

    .venv/bin/python benchmarks/bench_incremental.py [--keys 200000] [--batches 10] [--change 0.05]
        [--curve 50000,100000] [--json]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import EVENT_SCHEMA, emit, fresh, key_name, median, spark_session, write_parquet_batches

TARGET = 0.10


def run_one(spark: Any, base: Path, keys: int, batches: int, change: float, seed: int = 11) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DirectorySink

    rng = random.Random(seed)
    changed = max(1, int(keys * change))
    data = [[(key_name(i), 1) for i in range(keys)]]
    data += [[(key_name(i), rng.randrange(1, 100)) for i in rng.sample(range(keys),
                                                                       changed)] for _ in range(batches - 1)]
    write_parquet_batches(base / "input", data)
    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(base / "sparkpoint"), "spark.sparkpoint.job": "bench",
        "spark.sparkpoint.checkpoint.interval": "0",
        "spark.sparkpoint.checkpoint.numRetained": str(batches + 5),
        "spark.sparkpoint.trigger": "availableNow",
    }, argv=[])
    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger",
                                                          1).parquet(str(base / "input"))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"))
    result = job.run(totals, sink=DirectorySink(str(base / "out"), format="parquet"), output_mode="update")
    assert result.status == "finished" and result.batches_processed == batches, result
    metas = sorted(Catalog.open(str(base / "sparkpoint"), "bench").checkpoints(), key=lambda m: m.batch_id)
    rows = []
    for meta in metas:
        state = sum(f.size for f in meta.files if f.path.startswith("state/"))
        rows.append({"batch": meta.batch_id, "bytes_copied": meta.stats.bytes_copied,
                     "bytes_total": meta.stats.bytes_total, "state_bytes": state,
                     "files_copied": meta.stats.files_copied, "file_count": meta.stats.file_count,
                     "ratio": meta.stats.bytes_copied / max(1, meta.stats.bytes_total)})
    later = [r["ratio"] for r in rows[1:]]
    return {
        "keys": keys, "changed_per_batch": changed, "checkpoints": rows,
        "median_ratio": median(later), "mean_ratio": sum(later) / len(later), "max_ratio": max(later),
        "median_bytes_copied": median(r["bytes_copied"] for r in rows[1:]),
        "final_bytes_total": rows[-1]["bytes_total"], "final_state_bytes": rows[-1]["state_bytes"],
    }


def run(keys: int, batches: int, change: float, curve: list[int], maintenance: str) -> dict[str, Any]:
    spark = spark_session("bench-incremental", extra={
        "spark.sql.streaming.stateStore.maintenanceInterval": maintenance,
    })
    sizes = sorted({*curve, keys})
    runs = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        for size in sizes:
            runs[size] = run_one(spark, fresh(Path(tmp) / f"k{size}"), size, batches, change)
            r = runs[size]
            print(f"  {size:>8,} keys: median {r['median_ratio']:.3f}, mean {r['mean_ratio']:.3f}, "
                  f"max {r['max_ratio']:.3f}", file=sys.stderr)
    spark.stop()
    head = runs[keys]
    return {
        "name": "incremental",
        "keys": keys, "batches": batches, "change": change, "maintenance_interval": maintenance,
        "headline": head, "curve": [runs[s] for s in sizes],
        "ratio": head["median_ratio"], "target": f"<= {TARGET}", "pass": head["median_ratio"] <= TARGET,
        "summary": f"bytes copied / total state per checkpoint = {head['median_ratio']:.3f} median "
                   f"({head['mean_ratio']:.3f} mean incl. snapshot uploads) at {keys:,} keys, "
                   f"{change:.0%} changed (target <= {TARGET})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--change", type=float, default=0.05, help="fraction of keys updated per batch")
    parser.add_argument("--curve", default="50000,100000", help="further key counts for the growth curve")
    parser.add_argument("--maintenance", default="5s", help="Spark state store maintenance interval")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    curve = [int(x) for x in args.curve.split(",") if x.strip()]
    result = run(args.keys, args.batches, args.change, curve, args.maintenance)
    head = result["headline"]
    lines = [(f"Incremental checkpoints, {args.keys:,} keys, {args.change:.0%} updated per "
             f"batch, {args.batches} batches:"),
             f"  {'batch':>5}  {'copied':>12}  {'total':>12}  {'state':>12}  {'files':>9}  ratio"]
    for row in head["checkpoints"]:
        lines.append(f"  {row['batch']:>5}  {row['bytes_copied']:>12,}  {row['bytes_total']:>12,}  "
                     f"{row['state_bytes']:>12,}  {row['files_copied']:>4}/{row['file_count']:<4}  "
                     f"{row['ratio']:.3f}")
    lines.append("  growth: keys -> total bytes of the last checkpoint, median bytes copied per checkpoint")
    for run_ in result["curve"]:
        lines.append(f"  {run_['keys']:>10,} keys  {run_['final_bytes_total']:>12,}  "
                     f"{run_['median_bytes_copied']:>12,.0f}")
    emit(result, args.json, lines)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
