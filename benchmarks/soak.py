"""Soak: a stateful streaming job under Sparkpoint for a long time (issue 32).

A running-totals query (``groupBy(user).sum``) with a ``processingTime`` trigger of a few
seconds, a retained checkpoint after every batch (``checkpoint.interval=0``) to SeaweedFS
(``--store s3``, `s3_server.sh`) or local disk (``--store local``), retention on, a
savepoint requested through the control channel every ``--savepoint-every`` seconds,
input arriving continuously (one small parquet file a second), for ``--minutes``.

The job runs in its own driver process (this script with ``--driver``). It records, per
checkpoint: duration and its steps (hashing, uploads, the listing of ``shared/``, the new
id, ``_metadata``, retention), bytes copied, and the storage requests sent while it ran, by
kind and, on S3, the seconds they took
(GET, PUT, LIST, DELETE, HEAD, COPY, counted at botocore for S3 and by a `CountingStorage`
around the job's store on local disk, from the coordinator's and transfer threads only: the
heartbeat, the control polls between checkpoints and Spark's staging thread are left out). This process
records, per minute: the driver's RSS (the Python driver and its
JVM), the JVM heap after a full GC (``jcmd GC.run`` + ``GC.heap_info``, when jcmd exists),
open files and threads of both, and the objects in the job's store. Writes
``<out>/soak.json`` and a plot (``soak.png`` with matplotlib, else ``soak.svg``), and prints
last ÷ first quarter of the run for checkpoint duration, requests per checkpoint, RSS and
heap (goals: ≤ 1.2, ≤ 1.2, growth ≤ 10 %, ≤ 10 %).

    .venv/bin/python benchmarks/soak.py [--minutes 120] [--store s3|local] [--trigger 3s]
        [--savepoint-every 600] [--out soak-output]

A measurement, not a test (``make soak``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench import EVENT_SCHEMA, machine, spark_session

JOB = "soak"
KEYS = 5_000
ROWS_PER_FILE = 2_000
#: the counter key of the objects the checkpoint threads' listings returned (S3 only)
LISTED = "_listed"
#: the prefix of the counter keys that sum the seconds the requests of a kind took (S3 only)
SECONDS = "s:"
#: botocore operation -> request kind
S3_KIND = {"GetObject": "GET", "HeadObject": "HEAD", "PutObject": "PUT", "CreateMultipartUpload": "PUT",
           "UploadPart": "PUT", "CompleteMultipartUpload": "PUT", "ListObjectsV2": "LIST",
           "ListObjects": "LIST",
           "DeleteObject": "DELETE", "DeleteObjects": "DELETE", "CopyObject": "COPY",
           "UploadPartCopy": "COPY"}


# ---------------------------------------------------------------------------- the driver process


#: the threads a checkpoint's requests come from (the heartbeat and Spark's foreachBatch
#: thread write on their own clock and are left out)
CHECKPOINT_THREADS = ("sparkpoint-coordinator", "sparkpoint-upload", "sparkpoint-transfer",
                      "sparkpoint-prestore")


def _count_requests(conf: dict[str, str]) -> tuple[Counter[str], Any]:
    """Count the storage requests of the checkpoint threads by kind; returns the counter and a lock."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def mine() -> bool:
        return threading.current_thread().name.startswith(CHECKPOINT_THREADS)
    if conf["spark.sparkpoint.dir"].startswith("s3://"):
        from botocore.client import BaseClient

        original = BaseClient._make_api_call

        def counting(client: Any, operation: str, params: Any) -> Any:
            if not mine():
                return original(client, operation, params)
            kind = S3_KIND.get(operation, operation)
            started = time.perf_counter()
            response: Any = {}
            try:  # a request that fails counts too (the fence's HEAD of a missing key is a 404)
                response = original(client, operation, params)
                return response
            finally:
                elapsed = time.perf_counter() - started
                with lock:
                    counts[kind] += 1
                    counts[SECONDS + kind] += elapsed  # type: ignore[assignment]
                    if operation == "ListObjectsV2":
                        counts[LISTED] += len(response.get("Contents", ()))

        BaseClient._make_api_call = counting  # type: ignore[method-assign]
    else:
        import airflow_sparkpoint.checkpoints.catalog as catalog_module
        from airflow_sparkpoint.storage.counting import CountingStorage

        class Counted(CountingStorage):
            def _note(self, op: str, key: str) -> None:
                from airflow_sparkpoint.storage.counting import KIND_OF

                if mine():
                    with lock:
                        counts[KIND_OF[op]] += 1

        real_init = catalog_module.Catalog.__init__

        def init(self: Any, storage: Any, job: str) -> None:
            real_init(self, storage if isinstance(storage, CountingStorage) else Counted(storage), job)

        catalog_module.Catalog.__init__ = init  # type: ignore[method-assign]
    return counts, lock


def driver(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    conf: dict[str, str] = config["conf"]
    counts, lock = _count_requests(conf)
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.runtime.checkpointer import Checkpointer
    from airflow_sparkpoint.sinks import DeltaSink

    records = open(config["records"], "a", buffering=1)  # noqa: SIM115 - one line per checkpoint
    from _scale import Profiler

    phases = Profiler().install()  # the checkpoint's steps (hash, upload, listing, metadata, retention)
    real = Checkpointer._checkpoint

    def measured(self: Any, batch_id: int) -> Any:
        with lock:
            before = Counter(counts)
        started = time.perf_counter()
        meta = real(self, batch_id)
        elapsed = time.perf_counter() - started
        with lock:
            requests = dict(Counter(counts) - before)
        listed = requests.pop(LISTED, 0)
        request_seconds = {k[len(SECONDS):]: round(requests.pop(k), 4) for k in list(requests)
                           if k.startswith(SECONDS)}
        steps = {k: round(v, 4) for k, v in phases.checkpoints[-1].items() if k not in ("batch", "total")
                 and not k.startswith("s3:")} if phases.checkpoints else {}
        phases.checkpoints.clear()  # kept, they would grow the driver's RSS the soak measures
        records.write(json.dumps({"at": time.time(), "batch": batch_id, "id": meta.id, "seconds": elapsed,
                                  "bytes_copied": meta.stats.bytes_copied,
                                  "bytes_total": meta.stats.bytes_total,
                                  "files": meta.stats.file_count, "requests": requests,
                                  "objects_listed": listed, "request_seconds": request_seconds,
                                  "steps": steps}) + "\n")
        return meta

    Checkpointer._checkpoint = measured  # type: ignore[method-assign]
    if config.get("census"):
        _census(float(config["census"]), Path(config["records"]).with_name("census.jsonl"),
                trim_after_s=config.get("census_trim_after"))
    if config.get("tracemalloc"):
        _trace_python_growth(float(config["tracemalloc"]),
                             Path(config["records"]).with_name("tracemalloc.jsonl"))
    extra = ({"spark.driver.extraJavaOptions": "-XX:NativeMemoryTracking=summary"} if config.get("nmt")
             else None)
    spark = spark_session("sparkpoint-soak", cores=2, extra=extra)
    job = SparkpointJob.get_or_create(conf=conf, argv=[])
    events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 4).parquet(config["input"])
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = job.run(totals, sink=DeltaSink(config["table"], mode="merge", keys=["user"]),
                     output_mode="update")
    print(f"soak driver ended: {result.status}", flush=True)
    return 0


def _trace_python_growth(every_s: float, path: Path) -> None:
    """Where the driver's Python heap grows (`--tracemalloc`): a snapshot every `every_s`
    seconds, its 25 largest differences from the first (after warm-up) by allocating line,
    one JSON line each. It slows allocations and adds memory: a diagnosis run, not a report."""
    import tracemalloc

    tracemalloc.start(30)  # deep enough to reach the caller that keeps what a library allocated

    def loop() -> None:
        first = None
        with path.open("a", buffering=1) as out:
            while True:
                time.sleep(every_s)
                snapshot = tracemalloc.take_snapshot().filter_traces(
                    [tracemalloc.Filter(False, tracemalloc.__file__)])
                if first is None:
                    first = snapshot
                    continue
                top = snapshot.compare_to(first, "lineno")[:25]
                # The allocating line often names a library (botocore, json): its callers say who keeps it.
                stacks = snapshot.compare_to(first, "traceback")[:8]
                out.write(json.dumps({"at": time.time(),
                                      "traced_mb": tracemalloc.get_traced_memory()[0] / 1e6,
                                      "growth": [{"where": str(d.traceback[0]),
                                                  "kb": round(d.size_diff / 1e3, 1),
                                                  "count": d.count_diff} for d in top],
                                      "stacks": [{"kb": round(d.size_diff / 1e3, 1), "count": d.count_diff,
                                                  "stack": _own_frames(d.traceback)}
                                                 for d in stacks]}) + "\n")

    threading.Thread(target=loop, name="soak-tracemalloc", daemon=True).start()


def _census(every_s: float, path: Path, trim_after_s: float | None = None) -> None:
    """Which part of the driver's memory grows (`--census`), cheaply enough for a run at full
    speed: every `every_s` seconds the process's RSS beside what Python's allocator holds
    (blocks), what malloc hands out (Python's large objects, botocore's C parts, delta-rs'
    Rust heap), pyarrow's pool, the live objects, and the 15 types whose count grew most
    since the first census. One JSON line each. After `trim_after_s` seconds each census
    also asks malloc to return its free memory (`heap.trim`) and records the RSS after:
    what the RSS held that nothing used. (A running job also trims once an hour itself.)"""
    import ctypes
    import gc

    from airflow_sparkpoint.runtime import heap

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):  # not glibc 2.33+: the other figures still say a lot
        libc = None

    def types() -> Counter[str]:
        return Counter(type(o).__qualname__ for o in gc.get_objects())

    def loop() -> None:
        import pyarrow as pa

        first: Counter[str] | None = None
        page = os.sysconf("SC_PAGE_SIZE")
        began = time.monotonic()

        def rss() -> int:
            return int(Path("/proc/self/statm").read_text().split()[1]) * page

        with path.open("a", buffering=1) as out:
            while True:
                time.sleep(every_s)
                now = types()
                first = first if first is not None else now
                grew = sorted(((n - first.get(t, 0), t) for t, n in now.items()), reverse=True)[:15]
                info = libc.mallinfo2() if libc is not None else None
                record: dict[str, Any] = {}
                if trim_after_s is not None and time.monotonic() - began >= trim_after_s:
                    before = rss()
                    if heap.trim():
                        record = {"rss_before_trim": before}
                out.write(json.dumps({
                    "at": time.time(), "rss": rss(), **record, "python_blocks": sys.getallocatedblocks(),
                    "malloc_in_use": info.uordblks + info.hblkhd if info else None,
                    "malloc_free": info.fordblks if info else None, "arrow_bytes": pa.total_allocated_bytes(),
                    "objects": sum(now.values()), "threads": threading.active_count(),
                    "types_grown": [{"type": t, "count": n} for n, t in grew if n > 0]}) + "\n")

    threading.Thread(target=loop, name="soak-census", daemon=True).start()


def _own_frames(traceback: Any) -> list[str]:
    """The allocating frame and the Sparkpoint or benchmark frames above it, innermost first."""
    frames = [str(f) for f in reversed(traceback)]  # tracemalloc keeps the innermost frame last
    own = [f for f in frames[1:] if "airflow_sparkpoint" in f or "benchmarks" in f]
    return frames[:1] + own[:8]


# ---------------------------------------------------------------------------- this process


def _write_input(directory: Path, stop: threading.Event) -> None:
    """One small parquet file a second, with increasing mtimes, until `stop`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    index = 0
    while not stop.is_set():
        users = [f"user-{(index * ROWS_PER_FILE + i) % KEYS:07d}" for i in range(ROWS_PER_FILE)]
        table = pa.table({"user": pa.array(users, pa.string()),
                          "amount": pa.array([1] * ROWS_PER_FILE, pa.int64())})
        tmp = directory / f".part-{index:07d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, directory / f"part-{index:07d}.parquet")
        index += 1
        stop.wait(1.0)


def _proc(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024  # type: ignore[union-attr]
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return {"rss": rss, "threads": threads, "open_files": len(os.listdir(f"/proc/{pid}/fd"))}


def _jvm_pid(driver_pid: int) -> int | None:
    """The JVM py4j started for the driver: a java child process of it."""
    import psutil

    for child in psutil.Process(driver_pid).children(recursive=True):
        if "java" in child.name():
            return child.pid
    return None


def _jcmd(pid: int, *command: str, timeout: float = 60) -> str:
    """What ``jcmd <pid> <command>`` printed (its failures print nothing we parse)."""
    return subprocess.run(["jcmd", str(pid), *command], capture_output=True, text=True, timeout=timeout,
                          check=False).stdout


def _heap_after_gc(pid: int) -> tuple[int | None, int | None, int | None]:
    """(used, committed, resident) heap in bytes right after a full GC, from jcmd; Nones
    without jcmd.

    Committed heap is what the JVM holds from the OS for its heap, resident what of it is
    in RAM (the RSS of the heap's address range in /proc/<pid>/smaps): RSS growth that is
    not in it is native memory (RocksDB, threads, code cache, metaspace)."""
    if shutil.which("jcmd") is None:
        return None, None, None
    _jcmd(pid, "GC.run")
    out = _jcmd(pid, "GC.heap_info")
    found = re.search(r"total (\d+)K, used (\d+)K", out)
    bounds = re.search(r"\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", out)
    resident = _resident_in(pid, int(bounds.group(1), 16), int(bounds.group(2), 16)) if bounds else None
    return (int(found.group(2)) * 1024, int(found.group(1)) * 1024, resident) if found else (None, None, None)


def _resident_in(pid: int, start: int, end: int) -> int | None:
    """Bytes of `pid`'s RSS in the mappings inside [start, end) (/proc/<pid>/smaps)."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return None
    total, inside = 0, False
    for line in text.splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = start <= int(head.group(1), 16) and int(head.group(2), 16) <= end
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


#: NMT's summary lines: "Total: reserved=..KB, committed=..KB" and
#: "-  Java Heap (reserved=..KB, committed=..KB)"
_NMT_LINE = re.compile(r"^(?:Total|-\s*(?P<name>[A-Za-z][\w .-]*?))\s*[:(]\s*reserved=(\d+)KB, "
                       r"committed=(\d+)KB",
                       re.MULTILINE)


def _native_memory(pid: int) -> dict[str, int] | None:
    """The JVM's native memory by NMT category, committed bytes ({"total": .., "Java Heap": ..,
    "Thread": .., ...}), when the JVM runs with ``-XX:NativeMemoryTracking`` (`--nmt`); None
    without it or jcmd. What the RSS holds beyond NMT's total is memory the JVM does not
    track: native libraries' malloc (RocksDB) and the free memory malloc keeps."""
    if shutil.which("jcmd") is None:
        return None
    out = _jcmd(pid, "VM.native_memory", "summary", "scale=KB")
    found = {(m.group("name") or "total").strip(): int(m.group(3)) * 1024 for m in _NMT_LINE.finditer(out)}
    return found if "total" in found else None


def _class_histogram(pid: int, top: int = 400) -> dict[str, list[int]] | None:
    """The `top` classes by bytes of live objects: {class: [instances, bytes]} (jcmd's
    GC.class_histogram, which runs a full GC first); None without jcmd."""
    if shutil.which("jcmd") is None:
        return None
    out = _jcmd(pid, "GC.class_histogram", timeout=120)
    rows = [(m.group(3), int(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"^\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)", out, re.MULTILINE)]
    return {name: [count, size] for name, count, size in sorted(rows, key=lambda r: -r[2])[:top]}


def heap_growth(first: dict[str, list[int]], last: dict[str, list[int]],
                top: int = 12) -> list[dict[str, Any]]:
    """The classes whose live bytes grew most between two histograms."""
    grown: list[dict[str, Any]] = [
        {"class": name, "bytes_first": first.get(name, [0, 0])[1], "bytes_last": size,
         "instances_first": first.get(name, [0, 0])[0], "instances_last": count}
        for name, (count, size) in last.items()]
    return sorted(grown, key=lambda g: g["bytes_first"] - g["bytes_last"])[:top]


def _sample(driver_pid: int, catalog: Any, nmt: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {"at": time.time()}
    row["driver"] = _proc(driver_pid)
    jvm = _jvm_pid(driver_pid)
    if jvm is not None:
        row["jvm"] = _proc(jvm)
        row["heap_after_gc"], row["heap_committed"], row["heap_resident"] = _heap_after_gc(jvm)
        if nmt:
            row["nmt"] = _native_memory(jvm)
    row["store_objects"] = sum(1 for _ in catalog.store.list(""))
    row["retained_checkpoints"] = len(catalog.checkpoint_ids())
    row["shared_objects"] = sum(1 for _ in catalog.store.list("shared"))
    return row


def _fresh_client_probe(root: str, options: dict[str, Any]) -> dict[str, float] | None:
    """A new client's time for the checkpoint's kinds of request against the soak's store
    (median ms of 5 LISTs of ``shared/`` and 10 GETs of the counters record), beside the
    driver's long-lived one: if the driver's requests slow down and these do not, the
    cause is on the driver's side, not the server's. None for a local store."""
    if not root.startswith("s3://"):
        return None
    from airflow_sparkpoint.checkpoints import Catalog, layout
    from airflow_sparkpoint.storage import open_storage

    store = Catalog(open_storage(root, **options), JOB).store

    def ms(op: Any, times: int) -> float:
        taken = []
        for _ in range(times):
            began = time.perf_counter()
            op()
            taken.append((time.perf_counter() - began) * 1000)
        return statistics.median(taken)

    try:
        store.get(layout.COUNTERS)  # the connection and credentials, not timed
        return {"list_shared_ms": ms(lambda: sum(1 for _ in store.list(layout.SHARED)), 5),
                "get_ms": ms(lambda: store.get(layout.COUNTERS), 10)}
    except Exception as exc:  # noqa: BLE001 - no counters yet (or the server is busy): no probe this minute
        print(f"soak: no probe this minute: {exc}", file=sys.stderr)
        return None
    finally:
        store.close()


def quarter_ratio(values: Sequence[float]) -> float | None:
    """Median of the last quarter ÷ median of the first (None with fewer than 4 values)."""
    if len(values) < 4:
        return None
    q = len(values) // 4
    first = statistics.median(values[:q])
    return statistics.median(values[-q:]) / first if first else None


def _histogram_of(driver_pid: int) -> dict[str, Any]:
    jvm = _jvm_pid(driver_pid)
    return {"at": time.time(), "classes": _class_histogram(jvm) if jvm is not None else None}


def summarize(checkpoints: list[dict[str, Any]], samples: list[dict[str, Any]],
              savepoints: list[dict[str, Any]], histograms: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    steady = checkpoints[2:]  # the first ones upload the initial state
    rss = [s["driver"]["rss"] + s.get("jvm", {}).get("rss", 0) for s in samples]
    heap = [s["heap_after_gc"] for s in samples if s.get("heap_after_gc")]
    classes = [h["classes"] for h in histograms if h.get("classes")]
    return {
        "checkpoints": len(checkpoints),
        "checkpoint_seconds_ratio": quarter_ratio([c["seconds"] for c in steady]),
        "requests_per_checkpoint_ratio": quarter_ratio([sum(c["requests"].values()) for c in steady]),
        "requests_per_checkpoint_first_last": [dict(steady[0]["requests"]), dict(steady[-1]["requests"])]
        if steady else None,
        "rss_ratio": quarter_ratio(rss),
        "heap_after_gc_ratio": quarter_ratio(heap),
        "python_rss_ratio": quarter_ratio([s["driver"]["rss"] for s in samples]),
        "jvm_rss_ratio": quarter_ratio([s["jvm"]["rss"] for s in samples if "jvm" in s]),
        "heap_committed_ratio": quarter_ratio([s["heap_committed"] for s in samples
                                               if s.get("heap_committed")]),
        "heap_growth_by_class": heap_growth(classes[0], classes[-1]) if len(classes) >= 2 else None,
        "store_objects_max": max((s["store_objects"] for s in samples), default=None),
        "store_objects_last": samples[-1]["store_objects"] if samples else None,
        "savepoint_seconds": [s["seconds"] for s in savepoints],
    }


@contextmanager
def _store(kind: str, base: Path) -> Iterator[tuple[str, dict[str, str], dict[str, Any]]]:
    if kind == "local":
        yield str(base / "store"), {}, {}
        return
    from _scale import seaweedfs

    with seaweedfs("soak") as (endpoint, bucket, _version):
        yield f"s3://{bucket}/root", {"spark.sparkpoint.s3.endpoint": endpoint}, {"endpoint_url": endpoint}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
    from airflow_sparkpoint.storage import open_storage

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stop_input = threading.Event()
    with _store(args.store, out) as (root, extra_conf, options):
        conf = {"spark.sparkpoint.dir": root, "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": "none",
                "spark.sparkpoint.workDir": str(out / "live"),
                "spark.sparkpoint.trigger": f"processingTime:{args.trigger}",
                "spark.sparkpoint.checkpoint.interval": "0", "spark.sparkpoint.checkpoint.numRetained": "3",
                **extra_conf}
        config = {"conf": conf, "input": str(out / "input"), "table": str(out / "table"),
                  "records": str(out / "checkpoints.jsonl"), "tracemalloc": args.tracemalloc,
                  "census": args.census, "census_trim_after": args.census_trim_after, "nmt": args.nmt}
        (out / "driver.json").write_text(json.dumps(config))
        writer = threading.Thread(target=_write_input, args=(out / "input", stop_input), daemon=True)
        writer.start()
        log = open(out / "driver.log", "w")  # noqa: SIM115 - closed below
        env = dict(os.environ)
        if args.malloc_arena_max:  # glibc's arenas for the driver's Python and its JVM (RocksDB's malloc)
            env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
        proc = subprocess.Popen([sys.executable, __file__, "--driver", str(out / "driver.json")],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        catalog = Catalog(open_storage(root, **options), JOB)
        channel = ControlChannel(catalog)
        samples: list[dict[str, Any]] = []
        savepoints: list[dict[str, Any]] = []
        histograms: list[dict[str, Any]] = []
        disposed: list[str] = []
        started = time.monotonic()
        end = started + args.minutes * 60
        next_sample, next_savepoint = started + 30, started + args.savepoint_every
        next_histogram = started + min(600.0, args.minutes * 15)
        try:
            while time.monotonic() < end and proc.poll() is None:
                now = time.monotonic()
                if now >= next_sample:
                    samples.append({**_sample(proc.pid, catalog, args.nmt),
                                    "probe": _fresh_client_probe(root, options)})
                    next_sample += 60
                if now >= next_histogram:
                    histograms.append(_histogram_of(proc.pid))
                    next_histogram += args.histogram_every
                if now >= next_savepoint and catalog.current_generation():
                    began = time.monotonic()
                    request = channel.submit("savepoint", generation=catalog.current_generation(),
                                             timeout_s=600)
                    done = channel.wait(request.id, timeout_s=600, is_alive=lambda: proc.poll() is None)
                    savepoints.append({"at": time.time(), "seconds": time.monotonic() - began,
                                       "uri": done.savepoint})
                    next_savepoint += args.savepoint_every
                    if args.keep_savepoints:  # what a platform's schedule does beside the savepoints
                        disposed += savepoint_history_retention(catalog, max_count=args.keep_savepoints,
                                                                max_age_s=None)
                time.sleep(1.0)
            if proc.poll() is None:
                histograms.append(_histogram_of(proc.pid))
                request = channel.submit("stop", generation=catalog.current_generation(), timeout_s=600)
                channel.wait(request.id, timeout_s=600, is_alive=lambda: proc.poll() is None)
                proc.wait(timeout=600)
        finally:
            stop_input.set()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
            log.close()
    checkpoints = [json.loads(line) for line in (out / "checkpoints.jsonl").read_text().splitlines() if line]
    traced = out / "tracemalloc.jsonl"
    growth = [json.loads(line) for line in traced.read_text().splitlines() if line] if traced.exists() else []
    counted = out / "census.jsonl"
    census = ([json.loads(line) for line in counted.read_text().splitlines() if line] if counted.exists()
              else [])
    result = {"benchmark": "soak", "store": args.store, "minutes": args.minutes, "trigger": args.trigger,
              "nmt": args.nmt, "malloc_arena_max": args.malloc_arena_max,
              "driver_exit": proc.returncode, "machine": machine(),
              "summary": summarize(checkpoints, samples, savepoints, histograms),
              "disposed_savepoints": disposed, "histograms": histograms, "python_growth": growth,
              "census": census, "checkpoints": checkpoints, "samples": samples, "savepoints": savepoints}
    (out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
    result["plot"] = str(plot(result, out))
    return result


def plot(result: dict[str, Any], out: Path) -> Path:
    """Checkpoint duration and requests per checkpoint, RSS, heap and the store's objects over the run."""
    cps, samples = result["checkpoints"], result["samples"]
    t0 = cps[0]["at"] if cps else time.time()
    series = [
        ("checkpoint duration (s)", [(c["at"] - t0, c["seconds"]) for c in cps]),
        ("storage requests per checkpoint", [(c["at"] - t0, sum(c["requests"].values())) for c in cps]),
        ("driver RSS, Python + JVM (MiB)",
         [(s["at"] - t0, (s["driver"]["rss"] + s.get("jvm", {}).get("rss", 0)) / 2**20) for s in samples]),
        ("JVM heap after GC (MiB)", [(s["at"] - t0, s["heap_after_gc"] / 2**20) for s in samples
                                     if s.get("heap_after_gc")]),
        ("objects in the store", [(s["at"] - t0, s["store_objects"]) for s in samples]),
    ]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg(series, out / "soak.svg")
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.2 * len(series)), sharex=True)
    for ax, (title, points) in zip(axes, series):
        ax.plot([p[0] / 60 for p in points], [p[1] for p in points], lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=100)
    return path


def _svg(series: list[tuple[str, list[tuple[float, float]]]], path: Path) -> Path:
    """The same panels as polylines in a hand-written SVG (no matplotlib)."""
    width, height, parts = 640, 140, []
    for i, (title, points) in enumerate(series):
        top = i * (height + 20)
        parts.append(f'<text x="5" y="{top + 14}" font-size="12">{title}</text>')
        if points:
            xmax = max(p[0] for p in points) or 1
            ymax = max(p[1] for p in points) or 1
            coords = " ".join(f"{40 + p[0] / xmax * (width - 50):.1f},"
                              f"{top + height - p[1] / ymax * (height - 30):.1f}"
                              for p in points)
            parts.append(f'<polyline fill="none" stroke="steelblue" points="{coords}"/>')
            parts.append(f'<text x="5" y="{top + 30}" font-size="10">max {ymax:.3g}</text>')
    total = len(series) * (height + 20)
    path.write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
                    f'height="{total}">{"".join(parts)}</svg>')
    return path


def quarters(values: Sequence[float]) -> list[float]:
    """Medians of the four quarters of `values` (empty with fewer than 4)."""
    if len(values) < 4:
        return []
    q = len(values) // 4
    parts = [values[:q], values[q:2 * q], values[2 * q:len(values) - q], values[-q:]]
    return [statistics.median(part) for part in parts]


#: uploads run in parallel: their seconds can add up to more than the checkpoint's
UPLOAD_NOTE = ", summed over the transfer threads"
#: the steps of a checkpoint the profiler times, with what their figure means
STEP_NOTES = {"hash": "", "upload": UPLOAD_NOTE, "list_shared": ", beside the uploads", "validate": "",
              "next_id": "", "metadata": "", "retention": ""}


#: the NMT categories the quarter table shows (the rest are small and flat)
NMT_SHOWN = ("total", "Java Heap", "Class", "Metaspace", "Thread", "Code", "GC", "Internal", "Other",
             "Symbol", "Native Memory Tracking", "Arena Chunk")


def quarter_table(result: dict[str, Any]) -> str:
    """The report's table: medians per quarter of the run and last ÷ first, as Markdown."""
    steady = result["checkpoints"][2:]
    samples = result["samples"]
    jvm = [s for s in samples if "jvm" in s]
    rows: list[tuple[str, list[float], str, str]] = [
        ("storage requests per checkpoint", [sum(c["requests"].values()) for c in steady], "{:.0f}", "≤ 1.2"),
        ("bytes copied per checkpoint (KB)", [c["bytes_copied"] / 1e3 for c in steady], "{:.1f}", "flat"),
        ("files referenced per checkpoint", [c["files"] for c in steady], "{:.0f}", "flat"),
        ("objects listed per checkpoint", [c["objects_listed"] for c in steady if "objects_listed" in c],
         "{:,.0f}", "flat"),
        ("checkpoint duration (s)", [c["seconds"] for c in steady], "{:.3f}", "≤ 1.2"),
        ("of which in storage requests (s)", [sum(c["request_seconds"].values()) for c in steady
                                              if "request_seconds" in c], "{:.3f}", ""),
        *((f"of which {step} (s{note})", [c["steps"].get(step, 0.0) for c in steady if "steps" in c],
           "{:.3f}", "")
          for step, note in STEP_NOTES.items()),
        *((f"seconds per {kind} request", [c["request_seconds"][kind] / c["requests"][kind] for c in steady
                                           if c.get("requests", {}).get(kind)
                                           and kind in c.get("request_seconds", {})],
           "{:.4f}", "") for kind in ("GET", "HEAD", "PUT", "LIST", "DELETE")),
        ("a new client's LIST of `shared/` (ms)",
         [s["probe"]["list_shared_ms"] for s in samples if s.get("probe")], "{:.1f}", ""),
        ("a new client's GET (ms)", [s["probe"]["get_ms"] for s in samples if s.get("probe")], "{:.2f}", ""),
        ("driver RSS, Python (MB)", [s["driver"]["rss"] / 1e6 for s in samples], "{:.0f}", "≤ 1.10"),
        ("driver RSS, JVM (MB)", [s["jvm"]["rss"] / 1e6 for s in jvm], "{:,.0f}", "≤ 1.10"),
        *((f"driver, Python: {name}",
           [c[key] / scale for c in result.get("census", ()) if c.get(key) is not None],
           fmt, "") for name, key, scale, fmt in (
            ("objects", "objects", 1, "{:,.0f}"), ("allocator blocks", "python_blocks", 1, "{:,.0f}"),
            ("malloc in use (MB)", "malloc_in_use", 1e6, "{:.1f}"),
            ("malloc free, kept (MB)", "malloc_free", 1e6,
                                                                     "{:.1f}"))),
        ("JVM heap after a full GC (MB)",
         [s["heap_after_gc"] / 1e6 for s in samples if s.get("heap_after_gc")], "{:.0f}", "≤ 1.10"),
        ("JVM heap committed (MB)", [s["heap_committed"] / 1e6 for s in samples if s.get("heap_committed")],
         "{:.0f}", ""),
        *((f"JVM native memory (NMT committed): {name} (MB)", [s["nmt"].get(name, 0) / 1e6 for s in samples
                                                            if s.get("nmt")], "{:.1f}", "")
          for name in NMT_SHOWN),
        ("JVM heap resident (MB)", [s["heap_resident"] / 1e6 for s in samples if s.get("heap_resident")],
         "{:.0f}", ""),
        ("JVM RSS beyond the resident heap (MB)", [(s["jvm"]["rss"] - s["heap_resident"]) / 1e6
                                                   for s in jvm if s.get("heap_resident")], "{:.0f}", ""),
        ("JVM RSS beyond the resident heap and NMT's other categories: untracked malloc, RocksDB (MB)",
         [(s["jvm"]["rss"] - s["heap_resident"] - (s["nmt"]["total"] - s["nmt"].get("Java Heap", 0))) / 1e6
          for s in jvm if s.get("nmt") and s.get("heap_resident")], "{:.0f}", ""),
        ("JVM threads", [s["jvm"]["threads"] for s in jvm], "{:.0f}", "flat"),
        ("JVM open files", [s["jvm"]["open_files"] for s in jvm], "{:.0f}", "flat"),
        ("objects under `shared/`", [s["shared_objects"] for s in samples], "{:,.0f}", "bounded"),
        ("objects in the store", [s["store_objects"] for s in samples], "{:,.0f}", "bounded"),
    ]
    lines = ["| per quarter of the run (medians) | Q1 | Q2 | Q3 | Q4 | last ÷ first | goal |",
             "|---|---|---|---|---|---|---|"]
    for name, values, fmt, goal in rows:
        medians = quarters(values)
        if not medians:
            continue
        ratio = f"{medians[-1] / medians[0]:.2f}" if medians[0] else "n/a"
        lines.append(f"| {name} | {' | '.join(fmt.format(m) for m in medians)} | {ratio} | {goal} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--store", choices=("s3", "local"), default="s3")
    parser.add_argument("--trigger", default="3s")
    parser.add_argument("--savepoint-every", type=float, default=600.0, help="seconds between savepoints")
    parser.add_argument("--keep-savepoints", type=int, default=3,
                        help="dispose of savepoints beyond the N newest after each one (0: keep all)")
    parser.add_argument("--tracemalloc", type=float, default=0.0, metavar="SECONDS",
                        help="diagnosis: trace the driver's Python allocations, write "
                             "their growth every SECONDS "
                             "to tracemalloc.jsonl (slows the driver: not for a report run)")
    parser.add_argument("--census", type=float, default=0.0, metavar="SECONDS",
                        help="diagnosis at full speed: every SECONDS the driver's RSS "
                             "beside Python's, malloc's "
                             "and pyarrow's share and the object types that grew, to census.jsonl")
    parser.add_argument("--census-trim-after", type=float, metavar="SECONDS",
                        help="with --census: from SECONDS into the run, each census "
                             "first returns malloc's free "
                             "memory to the system (malloc_trim) and records the RSS before and after")
    parser.add_argument("--nmt", action="store_true",
                        help="diagnosis: run the driver's JVM with native memory "
                             "tracking and record its summary "
                             "every minute, to tell the JVM's own memory from RocksDB's and malloc's")
    parser.add_argument("--malloc-arena-max", type=int, default=0, metavar="N",
                        help="run the driver (Python and its JVM) with "
                             "MALLOC_ARENA_MAX=N (0: glibc's default)")
    parser.add_argument("--histogram-every", type=float, default=1800.0,
                        help="seconds between JVM class histograms (the first after 10 minutes)")
    parser.add_argument("--out", default="soak-output")
    parser.add_argument("--table", metavar="SOAK_JSON",
                        help="print the per-quarter table of a finished run and exit")
    parser.add_argument("--first-minutes", type=float, help="with --table: only the run's first N minutes "
                        "(to compare runs of different lengths)")
    args = parser.parse_args(argv)
    if args.driver:
        return driver(args.driver)
    if args.table:
        result = json.loads(Path(args.table).read_text())
        if args.first_minutes:
            start = result["checkpoints"][0]["at"] if result["checkpoints"] else 0.0
            end = start + args.first_minutes * 60
            result = {**result, "checkpoints": [c for c in result["checkpoints"] if c["at"] < end],
                      "samples": [s for s in result["samples"] if s["at"] < end],
                      "census": [c for c in result.get("census", ()) if c["at"] < end]}
        print(quarter_table(result))
        return 0
    # A `kill` of this process runs the cleanup of `run` too: the driver and the S3 server stop with it.
    def terminated(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second kill must not cut the cleanup short
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminated)
    result = run(args)
    s = result["summary"]

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    print(f"soak on {args.store}: {args.minutes:g} min, {s['checkpoints']} checkpoints, "
          f"{len(result['savepoints'])} savepoints, driver exit {result['driver_exit']}")
    print(f"  last/first quarter: checkpoint duration {fmt(s['checkpoint_seconds_ratio'])} (goal <= 1.2), "
          f"requests per checkpoint {fmt(s['requests_per_checkpoint_ratio'])} (goal <= 1.2), "
          f"RSS {fmt(s['rss_ratio'])}, heap after GC {fmt(s['heap_after_gc_ratio'])} (goal <= 1.10)")
    print(f"  requests per checkpoint, first and last: {s['requests_per_checkpoint_first_last']}")
    print(f"  store objects: max {s['store_objects_max']}, last {s['store_objects_last']}; "
          f"savepoint seconds {[round(x, 2) for x in s['savepoint_seconds']]}")
    print(f"  RSS Python {fmt(s['python_rss_ratio'])}, JVM {fmt(s['jvm_rss_ratio'])}, "
          f"JVM heap committed {fmt(s['heap_committed_ratio'])}; savepoints disposed: "
          f"{len(result['disposed_savepoints'])}")
    for grown in s["heap_growth_by_class"] or []:
        print(f"  heap {grown['class']}: {grown['bytes_first'] / 2**20:.1f} -> "
              f"{grown['bytes_last'] / 2**20:.1f} MiB "
              f"({grown['instances_first']} -> {grown['instances_last']} objects)")
    print(f"  {Path(args.out) / 'soak.json'}, {result['plot']}")
    return 0 if result["driver_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
