"""Restore-from-savepoint wall time ÷ a cold start of the same job with empty state
(a target of docs/BENCHMARKS.md).

A stateful job (running total per key, RocksDB with changelog checkpointing) builds
``--keys`` keys of state over ``--batches`` batches; a savepoint is taken from its
latest checkpoint (what `SparkpointSavepointOperator` does for a stopped job). Then,
alternating, in the same warm SparkSession:

* **restore**: the job with ``restore=<savepoint>`` under a fresh storage root (the
  savepoint is relocatable; it is never modified), writing to a copy of its table made
  before the clock starts, processes one new batch updating ``--change`` of the keys:
  materialize the savepoint, commit its pending transaction, load the state, run the
  batch, checkpoint, commit;
* **cold**: the same job, same new batch, with empty state (a fresh root, nothing to
  restore).

Both end when ``job.run`` returns (one batch processed, checkpointed and committed to a
fresh Delta table). Medians over ``--runs``. Target: restore ÷ cold ≤ 1.5.

    .venv/bin/python benchmarks/bench_restore.py [--keys 200000] [--batches 4] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import EVENT_SCHEMA, emit, fresh, key_name, median, spark_session, write_parquet_batches

TARGET = 1.5
JOB = "bench"


def run_job(spark: Any, inputs: Path, root: Path, table: Path, restore: str) -> tuple[float, Any]:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    started = time.perf_counter()
    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": restore,
        "spark.sparkpoint.trigger": "availableNow",
    }, argv=[])
    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = job.run(totals, sink=DeltaSink(str(table), mode="merge", keys=["user"]), output_mode="update")
    return time.perf_counter() - started, result


def run(keys: int, batches: int, change: float, runs: int) -> dict[str, Any]:
    from airflow_sparkpoint.checkpoints import Catalog

    spark = spark_session("bench-restore")
    rng = random.Random(5)
    changed = max(1, int(keys * change))
    history = [[(key_name(i), 1) for i in range(keys)]]
    history += [[(key_name(i), rng.randrange(1, 100)) for i in rng.sample(range(keys), changed)]
                for _ in range(batches - 1)]
    new_batch = [(key_name(i), rng.randrange(1, 100)) for i in rng.sample(range(keys), changed)]
    times: dict[str, list[float]] = {"restore": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        # The job's history, then its savepoint.
        write_parquet_batches(base / "input", history)
        _, built = run_job(spark, base / "input", base / "origin", base / "origin-table", "latest")
        assert built.batches_processed == batches, built
        origin = Catalog.open(str(base / "origin"), JOB)
        savepoint = origin.create_savepoint(origin.handle(origin.latest())).uri  # type: ignore[arg-type]
        state_bytes = origin.latest().total_bytes  # type: ignore[union-attr]
        # The new batch: after the history for the restored job, alone for the cold one.
        write_parquet_batches(base / "input", [new_batch], start=batches)
        write_parquet_batches(base / "cold-input", [new_batch], start=batches)
        for attempt in range(runs + 1):  # attempt 0 warms up and is not counted
            order = ("restore", "cold") if attempt % 2 == 0 else ("cold", "restore")
            for name in order:
                work = fresh(base / f"{name}-{attempt}")
                if name == "restore":
                    # The job resumes into its own table (the savepoint's pending commit targets it).
                    shutil.copytree(base / "origin-table", work / "table")
                    elapsed, result = run_job(spark, base / "input", work / "root", work / "table", savepoint)
                    assert result.restored_from == savepoint and result.first_batch == batches, result
                else:
                    elapsed, result = run_job(spark, base / "cold-input", work / "root", work / "table",
                                              "latest")
                    assert result.restore_mode == "empty", result
                assert result.batches_processed == 1, result
                if attempt:
                    times[name].append(elapsed)
                print(f"  {name:<8} run {attempt}{' (warm-up)' if not attempt else ''}: {elapsed:6.2f} s",
                      file=sys.stderr)
                shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    med = {name: median(values) for name, values in times.items()}
    ratio = med["restore"] / med["cold"]
    return {
        "name": "restore",
        "keys": keys, "history_batches": batches, "changed_keys": changed, "runs": runs,
        "savepoint_bytes": state_bytes, "median_s": med, "all_s": times,
        "ratio": ratio, "target": f"<= {TARGET}", "pass": ratio <= TARGET,
        "summary": f"restore from savepoint / cold start = {ratio:.2f} (target <= {TARGET})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=4, help="batches of history before the savepoint")
    parser.add_argument("--change", type=float, default=0.05, help="fraction of keys in the new batch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.keys, args.batches, args.change, args.runs)
    emit(result, args.json, [
        (f"Restore vs cold start, {args.keys:,} keys of state ({result['savepoint_bytes']:,} "
         "bytes in the savepoint), "
        f"one batch of {result['changed_keys']:,} updates, medians of {args.runs} runs:"),
        f"  restore from savepoint  {result['median_s']['restore']:7.2f} s",
        f"  cold start (empty)      {result['median_s']['cold']:7.2f} s",
    ])
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
