"""Shared pieces of the benchmark scripts: a local SparkSession, deterministic input
files, medians, the machine description and the JSON/human output convention.

Every ``bench_*.py`` prints its figures, its ratio and PASS/FAIL, or (``--json``) one
JSON document that `run_all.py` collects. They are measurements, not tests.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BASE_MTIME = 1_700_000_000
EVENT_SCHEMA = "user string, amount long"


def spark_session(app: str, *, cores: int = 2, shuffle_partitions: int = 2,
                  extra: Mapping[str, str] | None = None, master: str | None = None) -> Any:
    """A SparkSession (``local[cores]``, or `master`, e.g. a standalone cluster's
    ``spark://...``) with Sparkpoint's state store defaults (RocksDB with changelog
    checkpointing), so a plain Spark query and a Sparkpoint query run the same engine."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master or f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_parquet_batches(directory: Path, batches: Sequence[Sequence[tuple[str, int]]],
                          start: int = 0) -> int:
    """One parquet file per batch of ``(user, amount)`` rows, with increasing mtimes (one
    file = one micro-batch with ``maxFilesPerTrigger=1``). Returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rows = 0
    for offset, batch in enumerate(batches):
        index = start + offset
        users, amounts = zip(*batch) if batch else ((), ())
        table = pa.table({"user": pa.array(users, pa.string()), "amount": pa.array(amounts, pa.int64())})
        tmp = directory / f".part-{index:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (BASE_MTIME + index, BASE_MTIME + index))
        os.replace(tmp, directory / f"part-{index:05d}.parquet")
        rows += len(batch)
    return rows


def key_name(i: int) -> str:
    return f"user-{i:07d}"


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _first_line(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "unknown"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1).strip() if match else platform.processor() or "unknown"
    except OSError:
        pass
    memory = "unknown"
    try:
        kib = int(re.search(r"^MemTotal:\s+(\d+) kB",  # type: ignore[union-attr]
                            Path("/proc/meminfo").read_text(), re.MULTILINE).group(1))
        memory = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError):
        pass
    versions = {}
    for module in ("pyspark", "deltalake", "pyarrow", "boto3", "moto"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - reported as unknown
            versions[module] = "unknown"
    return {
        "nproc": os.cpu_count(),
        "memory": memory,
        "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": _first_line(["java", "-version"]),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **versions,
    }


def emit(result: dict[str, Any], as_json: bool, human: Sequence[str]) -> None:
    """Print `result` as JSON (for run_all.py) or the human lines, ending with PASS/FAIL."""
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return
    for line in human:
        print(line)
    print(f"{'PASS' if result['pass'] else 'FAIL'}: {result['summary']}")
