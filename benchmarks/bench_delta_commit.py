"""`DeltaSink` commit time vs the number of staged files (1, 100, 1,000): roughly flat.

The commit of a staged append batch is ONE Delta commit that adds the staged parquet
files by reference (no data is read or copied), carrying the job's app transaction; so
its cost should hardly depend on how many files the batch staged. For every file count
a fresh table gets a first batch, then ``--runs`` batches of N staged files (written
with pyarrow, ``--rows`` rows each, laid out and described exactly as `DeltaSink.stage`
does); only ``DeltaSink.commit`` is timed. No Spark is needed.

Flatness: commit(1,000 files) ÷ commit(1 file); PASS when ≤ 10 (1,000x the files).

    .venv/bin/python benchmarks/bench_delta_commit.py [--files 1,100,1000] [--runs 5] [--rows 100] [--json]
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import emit, median

JOB = "bench"
LIMIT = 10.0


def stage(table: Path, batch: int, files: int, rows: int) -> Any:
    """Write `files` parquet files into the batch's staging area; return its record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
    from airflow_sparkpoint.sinks.delta import STAGING, DeltaSink

    sink = DeltaSink(str(table), mode="append")
    txn = f"{JOB}-b{batch}-g1"
    staging = table / STAGING / JOB / txn
    staging.mkdir(parents=True)
    data = pa.table({"user": pa.array([f"user-{i}" for i in range(rows)]),
                     "amount": pa.array(list(range(rows)), pa.int64())})
    described = []
    for index in range(files):
        path = staging / f"part-{index:05d}-{uuid.uuid4()}-c000.snappy.parquet"
        pq.write_table(data, path, compression="snappy")
        described.append({"path": str(path.relative_to(table)), "size": path.stat().st_size,
                          "partition_values": {},
                          "num_records": rows, "modification_time": int(path.stat().st_mtime * 1000)})
    staged = {"mode": "append", "staging": str(staging.relative_to(table)), "files": described,
              "rows": rows * files,
              "schema": base64.b64encode(data.schema.serialize().to_pybytes()).decode("ascii")}
    return sink, TransactionRecord(JOB, batch, 1, sink.kind, sink.sink_id,
                                   {"config": sink.to_config(), "staged": staged})


def run(counts: list[int], runs: int, rows: int) -> dict[str, Any]:
    from deltalake import DeltaTable

    timings: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-", ignore_cleanup_errors=True) as tmp:
        for count in counts:
            table = Path(tmp) / f"table-{count}"
            sink, first = stage(table, 0, 1, rows)
            sink.commit(first)  # creates the table
            timings[count] = []
            for batch in range(1, runs + 1):
                sink, record = stage(table, batch, count, rows)
                started = time.perf_counter()
                outcome = sink.commit(record)
                timings[count].append(time.perf_counter() - started)
                assert outcome.status == "committed", outcome
            loaded = DeltaTable(str(table))
            assert loaded.transaction_version(JOB) == runs
            assert loaded.to_pyarrow_dataset().count_rows() == rows * (1 + count * runs)
            print(f"  {count:>5} files: median {median(timings[count]) * 1000:8.1f} ms", file=sys.stderr)
    med = {count: median(values) for count, values in timings.items()}
    ratio = med[max(counts)] / med[min(counts)]
    return {
        "name": "delta_commit",
        "rows_per_file": rows, "runs": runs,
        "median_ms": {str(k): round(v * 1000, 2) for k, v in med.items()},
        "all_ms": {str(k): [round(v * 1000, 2) for v in vs] for k, vs in timings.items()},
        "ratio": ratio, "target": f"<= {LIMIT:g} for {max(counts) // min(counts):,}x the files",
        "pass": ratio <= LIMIT,
        "summary": f"DeltaSink commit of {max(counts):,} files / {min(counts)} file = {ratio:.2f} "
                   f"(roughly flat: <= {LIMIT:g})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", default="1,100,1000", help="comma-separated staged file counts")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=100, help="rows per staged file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = sorted(int(x) for x in args.files.split(",") if x.strip())
    result = run(counts, args.runs, args.rows)
    emit(result, args.json, [f"DeltaSink commit time (append, one Delta commit), medians of {args.runs}:"]
         + [f"  {count:>6} staged files  {result['median_ms'][str(count)]:9.1f} ms" for count in counts])
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
