"""Throughput of a stateful query under Sparkpoint vs plain Spark (a target of docs/BENCHMARKS.md).

The same input (``--batches`` parquet files of ``--rows`` events over ``--keys`` users,
one file per micro-batch, ``availableNow``) and the same stateful query (running total
and count per user, update mode, RocksDB state store with changelog checkpointing) run:

* **sparkpoint**: `SparkpointJob.run` with a retained checkpoint after every batch
  (``checkpoint.interval=0``, local storage root) and `DeltaSink` append with two-phase
  commit (stage, record, checkpoint, commit with delta-rs). With the default
  ``delta.driverStagingMaxBytes`` these batches are staged from the driver; the
  ``sparkpoint, executors stage`` row (``driverStagingMaxBytes=0``) is shown for
  comparison and is not the verdict;
* **plain**: the query with a plain ``checkpointLocation`` and a plain ``foreachBatch``
  that appends the batch with ``deltalake.write_deltalake``.

With ``--cluster`` the three variants run against a Spark standalone cluster started
from the installed pyspark (a master and two workers on loopback, one core and 1 GiB
each, `tests.e2e.cluster`): the executors are JVMs of their own, so the executors-stage
row measures staging where it matters (executors writing staged files, the driver
recording and committing them).

Rows/s = input rows ÷ wall time of the whole run (query start to end). A round runs
each variant once, in alternating order; ``--warmup`` rounds are not counted (the JVM
keeps getting faster for several runs). The ratio is the median over ``--runs`` rounds
of each round's plain time ÷ sparkpoint time: the two runs of a round are seconds apart,
so the machine's drift cancels out of each ratio. Target: sparkpoint ÷ plain ≥ 0.90.

    .venv/bin/python benchmarks/bench_throughput.py [--batches 8] [--rows 200000] [--keys 50000] [--runs 5]
        [--warmup 2] [--cluster] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import EVENT_SCHEMA, emit, fresh, key_name, median, spark_session, write_parquet_batches

TARGET = 0.90


@contextlib.contextmanager
def standalone_cluster() -> Iterator[str]:
    """A master and two workers from the installed pyspark (the e2e suite's fixture code),
    stopped afterwards; yields the master URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.e2e.cluster import SparkCluster

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver binds loopback too
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-cluster-", ignore_cleanup_errors=True) as tmp:
        cluster = SparkCluster(base=Path(tmp))
        try:
            cluster.start()
            print(f"  standalone cluster {cluster.url} up in {cluster.started_in:.1f} s", file=sys.stderr)
            yield cluster.url
        finally:
            cluster.stop()


def make_input(directory: Path, batches: int, rows: int, keys: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    data = [[(key_name(rng.randrange(keys)), rng.randrange(1, 1000)) for _ in range(rows)]
            for _ in range(batches)]
    return write_parquet_batches(directory, data)


def query(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    return events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))


def run_sparkpoint(spark: Any, inputs: Path, work: Path, driver_staging: str = "32m") -> tuple[float, int]:
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(work / "sparkpoint"), "spark.sparkpoint.job": "bench",
        "spark.sparkpoint.restore": "latest", "spark.sparkpoint.checkpoint.interval": "0",
        "spark.sparkpoint.trigger": "availableNow",
        "spark.sparkpoint.delta.driverStagingMaxBytes": driver_staging,
    }, argv=[])
    started = time.perf_counter()
    result = job.run(query(spark, inputs), sink=DeltaSink(str(work / "table"), mode="append"),
                     output_mode="update")
    elapsed = time.perf_counter() - started
    assert result.status == "finished" and result.checkpoints_completed >= result.batches_processed, result
    return elapsed, _table_rows(work / "table")


def run_plain(spark: Any, inputs: Path, work: Path) -> tuple[float, int]:
    from deltalake import write_deltalake

    table = str(work / "table")

    def append(batch: Any, batch_id: int) -> None:
        write_deltalake(table, batch.toArrow(), mode="append")

    started = time.perf_counter()
    stream = (
        query(spark, inputs).writeStream.outputMode("update").foreachBatch(append)
        .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start()
    )
    stream.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, _table_rows(work / "table")


def run_sparkpoint_executors(spark: Any, inputs: Path, work: Path) -> tuple[float, int]:
    return run_sparkpoint(spark, inputs, work, driver_staging="0")


def _table_rows(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).to_pyarrow_dataset().count_rows())


def run(batches: int, rows: int, keys: int, runs: int, warmup: int = 2,
        master: str | None = None) -> dict[str, Any]:
    spark = spark_session("bench-throughput", master=master,
                          extra=({"spark.driver.host": "127.0.0.1", "spark.executor.memory": "768m"}
                                 if master else None))
    runners = {"sparkpoint": run_sparkpoint, "plain": run_plain, "executors": run_sparkpoint_executors}
    times: dict[str, list[float]] = {name: [] for name in runners}
    output_rows: dict[str, set[int]] = {name: set() for name in runners}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        total = make_input(base / "input", batches, rows, keys)
        for attempt in range(warmup + runs):
            counted = attempt >= warmup
            order = list(runners) if attempt % 2 == 0 else list(reversed(runners))
            for name in order:
                elapsed, written = runners[name](spark, base / "input", fresh(base / f"{name}-{attempt}"))
                output_rows[name].add(written)
                if counted:
                    times[name].append(elapsed)
                print(f"  {name:<10} round {attempt}{'' if counted else ' (warm-up)'}: {elapsed:6.2f} s, "
                      f"{total / elapsed:>9,.0f} rows/s", file=sys.stderr)
    spark.stop()
    assert (len({frozenset(v) for v in output_rows.values()}) == 1
            and len(output_rows["plain"]) == 1), output_rows
    med = {name: median(values) for name, values in times.items()}
    rate = {name: total / seconds for name, seconds in med.items()}
    rounds = [p / s for p, s in zip(times["plain"], times["sparkpoint"], strict=True)]
    ratio = median(rounds)
    executors_ratio = median(p / e for p, e in zip(times["plain"], times["executors"], strict=True))
    return {
        "name": "throughput",
        "batches": batches, "rows_per_batch": rows, "keys": keys, "runs": runs, "input_rows": total,
        "output_rows": next(iter(output_rows["plain"])),
        "median_s": med, "rows_per_s": rate, "all_s": times, "warmup_rounds": warmup, "round_ratios": rounds,
        "ratio": ratio, "target": f">= {TARGET}", "pass": ratio >= TARGET, "executors_ratio": executors_ratio,
        "master": master or "local[2]",
        "summary": f"throughput sparkpoint / plain = {ratio:.2f} (target >= {TARGET})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000, help="input rows per batch")
    parser.add_argument("--keys", type=int, default=50_000, help="distinct users (state size)")
    parser.add_argument("--runs", type=int, default=5, help="counted rounds")
    parser.add_argument("--warmup", type=int, default=2, help="rounds run first and not counted")
    parser.add_argument("--cluster", action="store_true",
                        help="run on a Spark standalone cluster (master + 2 workers) "
                             "started for the benchmark")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cluster:
        with standalone_cluster() as master:
            result = run(args.batches, args.rows, args.keys, args.runs, args.warmup, master=master)
    else:
        result = run(args.batches, args.rows, args.keys, args.runs, args.warmup)
    emit(result, args.json, [
        (f"Throughput on {result['master']}, {args.batches} batches x {args.rows:,} rows over {args.keys:,} "
         f"keys, medians of {args.runs} "
         f"rounds after {args.warmup} warm-up rounds:"),
        (f"  sparkpoint (checkpoint every batch, DeltaSink 2PC)  {result['median_s']['sparkpoint']:7.2f} s  "
        f"{result['rows_per_s']['sparkpoint']:>10,.0f} rows/s"),
        (f"  plain (checkpointLocation, foreachBatch append)     {result['median_s']['plain']:7.2f} s  "
        f"{result['rows_per_s']['plain']:>10,.0f} rows/s"),
        (f"  comparison: sparkpoint, executors stage every batch {result['median_s']['executors']:7.2f} s  "
         f"{result['rows_per_s']['executors']:>10,.0f} rows/s  (ratio {result['executors_ratio']:.2f})"),
        "  plain ÷ sparkpoint per round: " + ", ".join(f"{r:.2f}" for r in result["round_ratios"]),
    ])
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
