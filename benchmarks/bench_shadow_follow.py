"""Seconds per batch of a shadow following blue (zero-downtime blue-green, #49) ÷ the
trigger interval, and ÷ blue's own seconds per batch.

Blue (a stateful job: per-user totals, RocksDB, appended to Delta) runs ``--batches``
batches of ``--updates`` rows over ``--keys`` users with ``availableNow`` and a
checkpoint each (all retained). Green, in the same warm SparkSession, follows it as its
shadow (``spark.sparkpoint.shadow.mode=discard``) from blue's checkpoint of batch 0:
each batch is one ``Trigger.Once`` query start on blue's recorded offsets, then a
checkpoint into green's own root (`runtime.follow`). Green's seconds per batch is the
mean its progress record reports; a shadow keeps up with blue only while it stays below
blue's trigger interval (target: ≤ 0.5 of ``--trigger``, so a cutover can catch up).

    .venv/bin/python benchmarks/bench_shadow_follow.py [--keys 20000] [--batches 8] [--trigger 10] [--json]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import EVENT_SCHEMA, emit, key_name, spark_session, write_parquet_batches

TARGET = 0.5
JOB = "bench"


def query(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    return events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))


def run(keys: int, batches: int, updates: int, trigger_s: float) -> dict[str, Any]:
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.follow_record import read_follow
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    spark = spark_session("bench-shadow-follow")
    rng = random.Random(7)
    history = [[(key_name(i), 1) for i in range(keys)]]
    history += [[(key_name(rng.randrange(keys)), rng.randrange(1, 100)) for _ in range(updates)]
                for _ in range(batches - 1)]
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        write_parquet_batches(base / "input", history)
        blue_conf = {"spark.sparkpoint.dir": str(base / "blue"), "spark.sparkpoint.job": JOB,
                     "spark.sparkpoint.checkpoint.numRetained": str(batches + 1)}
        started = time.perf_counter()
        blue = SparkpointJob.get_or_create(conf=blue_conf, argv=[])
        built = blue.run(query(spark, base / "input"), sink=DeltaSink(str(base / "table"), mode="append"),
                         output_mode="update")
        blue_s = time.perf_counter() - started
        assert built.batches_processed == batches, built
        from deltalake import DeltaTable

        stamps = sorted(int(e["timestamp"]) for e in DeltaTable(str(base / "table")).history()
                        if e.get("sparkpoint.batch") is not None)
        blue_steady = (stamps[-1] - stamps[0]) / 1000 / (len(stamps) - 1)  # commit to commit, after batch 0
        catalog = Catalog.open(str(base / "blue"), JOB)
        first = next(m for m in catalog.checkpoints() if m.batch_id == 0)

        started = time.perf_counter()
        green = SparkpointJob.get_or_create(conf={
            **blue_conf, "spark.sparkpoint.shadow.mode": "discard",
            "spark.sparkpoint.shadow.dir": str(base / "green"),
            "spark.sparkpoint.shadow.from": catalog.handle(first).uri}, argv=[])
        result = green.run(query(spark, base / "input"), sink=DeltaSink(str(base / "table"), mode="append"),
                           output_mode="update")
        green_s = time.perf_counter() - started
        assert result.last_batch == batches - 1, result
        progress = read_follow(Catalog.open(str(base / "green"), f"{JOB}-shadow").store)
        assert progress is not None and progress.seconds_per_batch is not None, progress
    spark.stop()
    per_batch = progress.seconds_per_batch
    blue_per_batch = blue_s / batches
    ratio = per_batch / trigger_s
    return {
        "name": "shadow_follow",
        "keys": keys, "batches": batches, "updates_per_batch": updates, "trigger_s": trigger_s,
        "green_seconds_per_batch": per_batch, "green_wall_s": green_s, "followed_batches": batches - 1,
        "blue_seconds_per_batch": blue_per_batch, "blue_steady_seconds_per_batch": blue_steady,
        "green_over_blue": per_batch / blue_steady,
        "ratio": ratio, "target": f"<= {TARGET}", "pass": ratio <= TARGET,
        "summary": f"shadow seconds per batch / trigger interval = {ratio:.2f} (target <= {TARGET})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--updates", type=int, default=2_000, help="rows per batch after the first")
    parser.add_argument("--trigger", type=float, default=10.0, help="blue's trigger interval, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.keys, args.batches, args.updates, args.trigger)
    emit(result, args.json, [
        (f"Shadow following blue: {args.keys:,} keys of state, {result['followed_batches']} batches of "
         f"{args.updates:,} rows:"),
        f"  green (shadow) seconds per followed batch  {result['green_seconds_per_batch']:7.2f} s",
        f"  blue wall time per batch (its start included)    {result['blue_seconds_per_batch']:7.2f} s",
        f"  blue commit to commit after batch 0        {result['blue_steady_seconds_per_batch']:7.2f} s",
        f"  green / blue (commit to commit)            {result['green_over_blue']:7.2f}",
        f"  green wall time (start, restore, follow)   {result['green_wall_s']:7.2f} s",
    ])
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
