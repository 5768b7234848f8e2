"""Pieces of the production-scale benchmarks (`bench_scale.py`): numeric-key input at
tens of millions of rows, a SeaweedFS server, and a profiler that times the
coordinator's checkpoint phases and the restore's materialization in this process.

The profiler wraps methods of the installed classes (benchmark-only instrumentation:
nothing in `airflow_sparkpoint` knows about it); with Spark in ``local[N]`` the driver,
and so the coordinator, runs in the benchmark process.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SCALE_SCHEMA = "user long, amount long"
HERE = Path(__file__).resolve().parent


def write_numeric_batches(directory: Path, batches: list[Any], start: int = 0) -> int:
    """One parquet file per batch; each batch is a numpy array of keys (amount = key % 97 + 1)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from _bench import BASE_MTIME

    directory.mkdir(parents=True, exist_ok=True)
    rows = 0
    for offset, keys in enumerate(batches):
        index = start + offset
        keys = np.asarray(keys, dtype=np.int64)
        table = pa.table({"user": pa.array(keys), "amount": pa.array(keys % 97 + 1)})
        tmp = directory / f".part-{index:05d}.parquet.tmp"
        pq.write_table(table, tmp, row_group_size=1 << 20)
        os.utime(tmp, (BASE_MTIME + index, BASE_MTIME + index))
        os.replace(tmp, directory / f"part-{index:05d}.parquet")
        rows += len(keys)
    return rows


def load_batches(keys: int, chunk: int) -> list[Any]:
    """Every key once, in batches of at most `chunk` keys (the state's first build)."""
    import numpy as np

    return [np.arange(lo, min(keys, lo + chunk), dtype=np.int64) for lo in range(0, keys, chunk)]


def update_batches(keys: int, change: float, count: int, seed: int) -> list[Any]:
    """`count` batches, each updating a random `change` fraction of the keys (no repeats within one)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    changed = max(1, int(keys * change))
    return [np.sort(rng.choice(keys, size=changed, replace=False)) for _ in range(count)]


@contextlib.contextmanager
def seaweedfs(bucket: str = "sp-scale") -> Iterator[tuple[str, str, str]]:
    """SeaweedFS from `s3_server.sh` in a temp dir: (endpoint, bucket, version)."""
    script = str(HERE / "s3_server.sh")
    with tempfile.TemporaryDirectory(prefix="sparkpoint-seaweedfs-", ignore_cleanup_errors=True) as tmp:
        started = subprocess.run([script, "start", tmp, bucket], check=False, capture_output=True, text=True)
        try:
            if started.returncode != 0:
                raise RuntimeError(f"s3_server.sh start failed (exit {started.returncode}): "
                                   f"{started.stderr[-2000:]}")
            endpoint = (Path(tmp) / "endpoint").read_text().strip()
            found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", started.stdout)
            version = f"SeaweedFS {found.group(1)}" if found else "SeaweedFS"
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            yield endpoint, bucket, version
        finally:
            subprocess.run([script, "stop", tmp], check=False, capture_output=True)


class Profiler:
    """Wall time of the coordinator's checkpoint phases, per checkpoint, and of restore
    materialization, per restore. Install once per process; `checkpoints` and
    `restores` fill as jobs run."""

    def __init__(self) -> None:
        self.checkpoints: list[dict[str, float]] = []
        self.restores: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None
        self._lock = threading.Lock()  # uploads run in transfer threads
        self.progress: list[dict[str, Any]] = []

    def listen(self, spark: Any) -> Profiler:
        """Collect every streaming query's progress (``durationMs``: Spark's own time per batch)."""
        import json

        from pyspark.sql.streaming import StreamingQueryListener

        progress = self.progress = []

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress.append(json.loads(event.progress.json))

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Listener())
        return self

    def spark_seconds(self, since: int) -> float:
        """Spark's triggerExecution time of the batches with input since progress index `since`."""
        time.sleep(0.5)  # progress events arrive asynchronously
        return sum(p["durationMs"].get("triggerExecution", 0) for p in self.progress[since:]
                   if p.get("numInputRows", 0) > 0) / 1000

    def _add(self, phase: str, seconds: float) -> None:
        with self._lock:
            if self._current is not None:
                self._current[phase] = self._current.get(phase, 0.0) + seconds

    def _timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(phase, time.perf_counter() - started)
        return wrapper

    def install(self) -> Profiler:
        from airflow_sparkpoint.checkpoints.catalog import Catalog
        from airflow_sparkpoint.runtime import checkpointer, livedir, restore
        from airflow_sparkpoint.runtime.committer import Committer

        C = checkpointer.Checkpointer
        original_checkpoint = C._checkpoint

        def checkpoint(this: Any, batch_id: int) -> Any:
            self._current = {"batch": float(batch_id)}
            started = time.perf_counter()
            try:
                return original_checkpoint(this, batch_id)
            finally:
                self._current["total"] = time.perf_counter() - started
                self.checkpoints.append(self._current)
                self._current = None

        C._checkpoint = checkpoint  # type: ignore[method-assign]
        livedir.file_sha256 = self._timed("hash", livedir.file_sha256)
        for cls, name, phase in ((C, "_upload", "upload"), (C, "_list_stored", "list_shared"),
                                 (C, "_ensure_stored", "validate"), (C, "_complete", "metadata"),
                                 (Committer, "_forget_settled", "forget_settled")):
            setattr(cls, name, self._timed(phase, getattr(cls, name)))
        checkpointer.enforce_checkpoint_retention = self._timed("retention",
                                                                checkpointer.enforce_checkpoint_retention)
        Catalog.next_checkpoint_id = self._timed("next_id", Catalog.next_checkpoint_id)  # type: ignore[method-assign]
        original_materialize = restore.materialize

        def materialize(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original_materialize(*args, **kwargs)
            finally:
                self.restores.append({"materialize": time.perf_counter() - started})

        restore.materialize = materialize
        from botocore.client import BaseClient

        original_call = BaseClient._make_api_call

        def make_api_call(client: Any, operation: str, params: Any) -> Any:
            if self._current is not None:
                key = f"s3:{operation}"
                self._current[key] = self._current.get(key, 0) + 1
            return original_call(client, operation, params)

        BaseClient._make_api_call = make_api_call  # type: ignore[method-assign]
        return self


def read_once_local(paths: list[str]) -> float:
    """Seconds to read every file once (8 MiB chunks): the floor of any restore from local disk."""
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb") as handle:
            while handle.read(8 << 20):
                pass
    return time.perf_counter() - started


def read_once_s3(endpoint: str, bucket: str, keys: list[str], threads: int = 8) -> float:
    """Seconds to GET every object once, `threads` at a time (what `aws s3 cp --recursive` does)."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=threads))

    def get(key: str) -> None:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        while body.read(8 << 20):
            pass

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(get, keys))
    return time.perf_counter() - started


# Spark's state store logs (INFO) go to a file of their own: the RocksDB provider logs when
# it starts and ends loading a version and which changelogs it replays, which is where a
# restart's first batch spends its time (StreamingQueryProgress does not report the load).
_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
appender.state.type = File
appender.state.name = state
appender.state.fileName = {path}
appender.state.layout.type = PatternLayout
appender.state.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
logger.state.name = org.apache.spark.sql.execution.streaming.state
logger.state.level = info
logger.state.additivity = false
logger.state.appenderRef.state.ref = state
"""
_STORE = r"partitionId=(\d+), storeName=(\S+) \], queryRunId=([0-9a-f-]+) \]"
_LOADING = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) .*" + _STORE + r": Loading (\d+) ")
_LOADED = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) .*" + _STORE + r": Loaded (\d+)$")
_REPLAY = re.compile(r"^.*" + _STORE + r": Replaying changelog from version (\d+) -> Some\((\d+)\)")


def state_log_conf(directory: Path) -> tuple[dict[str, str], Path]:
    """Spark conf that sends the state store's INFO logs to a file; (conf, log path)."""
    path = directory / "state-store.log"
    props = directory / "log4j2-state.properties"
    props.write_text(_LOG4J.replace("{path}", str(path)))
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{props}"}, path


def state_log_offset(path: Path | None) -> int:
    try:
        return path.stat().st_size if path else 0
    except FileNotFoundError:
        return 0


def state_loads(path: Path | None, offset: int, end: int | None = None) -> dict[str, Any]:
    """Spark's state loads logged between `offset` and `end`: the first load of each store of each
    query run (a restart's state load). ``load_s``: the longest of them (the stores load in
    parallel); ``snapshot``: the RocksDB snapshot version it started from; ``replayed``:
    changelogs replayed after it (summed over stores)."""
    if path is None or not path.exists():
        return {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        handle.seek(offset)
        lines = handle.read(None if end is None else max(0, end - offset)).splitlines()

    def seconds(m: re.Match[str]) -> float:
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) + int(m.group(4)) / 1000

    started: dict[tuple[str, ...], float] = {}
    took: dict[tuple[str, ...], float] = {}
    snapshot: dict[tuple[str, ...], int] = {}
    replayed: dict[tuple[str, ...], int] = {}
    for line in lines:
        if (m := _LOADING.match(line)) and (key := (m.group(7), m.group(5), m.group(6))) not in started:
            started[key] = seconds(m)
        elif (m := _LOADED.match(line)) and (key := (m.group(7), m.group(5), m.group(6))) in started \
                and key not in took:
            took[key] = (seconds(m) - started[key]) % 86400
        elif (m := _REPLAY.match(line)) and (key := (m.group(3), m.group(1), m.group(2))) not in snapshot:
            snapshot[key] = int(m.group(4))
            replayed[key] = int(m.group(5)) - int(m.group(4))
    if not took:
        return {}
    return {"load_s": max(took.values()), "stores": len(took),
            "snapshot": min(snapshot.values()) if snapshot else None, "replayed": sum(replayed.values())}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
