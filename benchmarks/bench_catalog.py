"""Catalog cost as state grows: storage requests and wall time of `Catalog.latest()` and
`enforce_checkpoint_retention(catalog, ...)` with 10, 100, 1,000 and 10,000 shared files (numRetained=3).

For every size the script builds a job whose state has that many files, then takes
checkpoints that each rewrite 5 % of them (at least one), running retention after each,
as the runtime does. It then measures:

* ``latest()`` — the newest valid checkpoint, fully validated (every referenced file
  present with its size);
* ``enforce_checkpoint_retention(catalog, 3)`` right after one more checkpoint: drop the oldest retained
  checkpoint and collect the shared files nobody references any more.

Requests are counted by a `Storage` proxy wrapped around the store (one per call) and,
on S3, also as the HTTP requests botocore sends (a listing of 10,000 keys is 10 pages).
The target (incremental checkpoints + shared registry, docs/concepts.md): requests grow with
retained checkpoints and listing pages, not with every file ever written — a per-file
check would make requests(10,000) / requests(10) about 1,000; PASS needs <= 20.

Local disk runs under a temp dir; S3 runs against a moto server this script starts on
127.0.0.1 (and stops at the end). The 10,000-file S3 case uploads in a thread pool and
takes about a minute.

    .venv/bin/python benchmarks/bench_catalog.py [--sizes 10,100,1000,10000] [--backends local,s3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata, sha256_hex
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.storage import Storage, open_storage
from airflow_sparkpoint.storage.counting import CountingStorage

NUM_RETAINED = 3
CHECKPOINTS = 5  # taken before the measured one
CHURN = 0.05  # fraction of state files rewritten per checkpoint
THREADS = 16
RATIO_LIMIT = 20.0
DEFAULT_SIZES = (10, 100, 1_000, 10_000)


class HttpCounter:
    """Counts the HTTP requests an S3 store's botocore client sends (0 for other stores)."""

    def __init__(self, store: Storage) -> None:
        self.count = 0
        client = getattr(store, "client", None)
        if client is not None:
            client.meta.events.register("before-send.s3", self._record)

    def _record(self, **_: Any) -> None:
        self.count += 1


def state_path(index: int, version: int) -> str:
    return f"state/{index % 8}/{index}/{version}.delta"


def upload(store: Storage, items: list[tuple[str, bytes]]) -> None:
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda kv: store.put(*kv), items))


def checkpoint(catalog: Catalog, files: dict[str, bytes], changed: Iterable[str],
               batch_id: int) -> SnapshotMetadata:
    """Upload the changed files and complete a checkpoint of `files` (as the coordinator does)."""
    refs, new = [], []
    changed_set = set(changed)
    for path, data in files.items():
        sha = sha256_hex(data)
        key = catalog.shared_key(path, sha)
        refs.append(FileRef(path=path, key=key, size=len(data), sha256=sha))
        if path in changed_set:
            new.append((key, data))
    upload(catalog.store, new)
    meta = SnapshotMetadata(kind="checkpoint", id=catalog.next_checkpoint_id(), job=catalog.job, generation=1,
                            batch_id=batch_id, created_at=time.time(), files=tuple(refs))
    catalog.complete_checkpoint(meta)
    return meta


def measure(fn: Callable[[], Any], counting: CountingStorage,
            http: HttpCounter) -> tuple[Any, int, int, float]:
    counting.reset()
    before = http.count
    started = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - started
    return value, counting.total, http.count - before, elapsed


def run_size(root_uri: str, options: dict[str, Any], size: int) -> dict[str, Any]:
    inner = open_storage(root_uri, **options)
    counting = CountingStorage(inner)
    http = HttpCounter(inner)
    catalog = Catalog(counting, f"bench-{size}")
    catalog.claim_generation()

    versions = dict.fromkeys(range(size), 0)
    files = {state_path(i, 0): f"state {i} v0".encode().ljust(64, b".") for i in range(size)}
    written = len(files)
    changed: list[str] = list(files)
    churn = max(1, int(size * CHURN))
    setup_started = time.perf_counter()
    for batch in range(CHECKPOINTS):
        checkpoint(catalog, files, changed, batch)
        enforce_checkpoint_retention(catalog, NUM_RETAINED)
        changed = []
        for i in range((batch * churn) % size, (batch * churn) % size + churn):
            index = i % size
            del files[state_path(index, versions[index])]
            versions[index] += 1
            path = state_path(index, versions[index])
            files[path] = f"state {index} v{versions[index]}".encode().ljust(64, b".")
            changed.append(path)
        written += len(changed)
    setup_s = time.perf_counter() - setup_started

    latest_runs = [measure(catalog.latest, counting, http) for _ in range(3)]
    newest, latest_calls, latest_http, _ = latest_runs[0]
    assert newest is not None and newest.id == CHECKPOINTS, newest
    latest_ms = statistics.median(r[3] for r in latest_runs) * 1000

    checkpoint(catalog, files, changed, CHECKPOINTS)
    result, ret_calls, ret_http, ret_s = measure(lambda: enforce_checkpoint_retention(catalog, NUM_RETAINED),
                                                 counting, http)
    retained = catalog.checkpoints()
    assert len(retained) == NUM_RETAINED
    present = {info.key for info in inner.list(catalog.job)}
    lost = [ref.key for meta in retained for ref in meta.files if f"{catalog.job}/{ref.key}" not in present]
    assert not lost, f"retention deleted referenced files: {lost[:5]}"
    inner.close()
    return {
        "shared_files": size,
        "files_ever_written": written,
        "setup_s": round(setup_s, 2),
        "latest": {"storage_calls": latest_calls, "http_requests": latest_http, "ms": round(latest_ms, 2)},
        "retention": {"storage_calls": ret_calls, "http_requests": ret_http, "ms": round(ret_s * 1000, 2),
                      "deleted_checkpoints": list(result.deleted_checkpoints),
                      "deleted_files": result.deleted_files},
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_backend(backend: str, sizes: list[int], progress: bool) -> dict[str, Any]:
    server = None
    rows = []
    try:
        if backend == "local":
            tmp = tempfile.TemporaryDirectory(prefix="sparkpoint-bench-")
            root, options = tmp.name, {}
        else:
            import boto3
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            port = free_port()
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            server.start()
            endpoint = f"http://127.0.0.1:{port}"
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
            root, options = f"s3://{bucket}/root", {"endpoint_url": endpoint, "region_name": "us-east-1",
                                                    "max_pool_connections": THREADS * 2}
        for size in sizes:
            row = run_size(root, options, size)
            rows.append(row)
            if progress:
                print(f"  {backend} {size:>6} files: setup {row['setup_s']:.1f} s", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
        if backend == "local":
            tmp.cleanup()
    key = "http_requests" if backend == "s3" else "storage_calls"
    first, last = rows[0], rows[-1]
    ratios = {op: last[op][key] / max(1, first[op][key]) for op in ("latest", "retention")}
    return {"backend": backend, "counted": key, "rows": rows, "ratios": ratios,
            "files_ratio": last["shared_files"] / first["shared_files"],
            "pass": all(r <= RATIO_LIMIT for r in ratios.values())}


def print_report(results: list[dict[str, Any]]) -> None:
    print(f"Catalog cost vs state size (numRetained={NUM_RETAINED}, {CHECKPOINTS + 1} checkpoints, "
          f"{CHURN:.0%} of files rewritten per checkpoint)")
    header = (f"{'backend':<8}{'shared':>8}{'written':>9}   {'latest: calls':>13}{'http':>6}{'ms':>9}"
              f"   {'retention: calls':>16}{'http':>6}{'ms':>9}{'deleted':>9}")
    print(header)
    for result in results:
        for row in result["rows"]:
            lat, ret = row["latest"], row["retention"]
            http_l = lat["http_requests"] if result["backend"] == "s3" else "-"
            http_r = ret["http_requests"] if result["backend"] == "s3" else "-"
            print(f"{result['backend']:<8}{row['shared_files']:>8}{row['files_ever_written']:>9}   "
                  f"{lat['storage_calls']:>13}{http_l:>6}{lat['ms']:>9.1f}   "
                  f"{ret['storage_calls']:>16}{http_r:>6}{ret['ms']:>9.1f}{ret['deleted_files']:>9}")
    print()
    for result in results:
        rows = result["rows"]
        what = "HTTP requests" if result["counted"] == "http_requests" else "storage calls"
        print(f"{result['backend']}: {what} ({rows[-1]['shared_files']:,} files) / "
              f"({rows[0]['shared_files']:,} files) "
              f"with {result['files_ratio']:,.0f}x the files: latest() {result['ratios']['latest']:.1f}x, "
              f"enforce_retention() {result['ratios']['retention']:.1f}x  (limit {RATIO_LIMIT:g}x)")
    verdict = all(r["pass"] for r in results)
    print(f"{'PASS' if verdict else 'FAIL'}: catalog requests grow with retained "
          "checkpoints and listing pages, "
          "not with every file ever written")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated shared-file counts (default: 10,100,1000,10000)")
    parser.add_argument("--backends", default="local,s3", help="comma-separated: local, s3 (default: both)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if len(sizes) < 2 or any(s < 1 for s in sizes) or any(b not in ("local", "s3") for b in backends):
        parser.error("--sizes needs at least two positive counts; --backends takes local and/or s3")
    results = [run_backend(b, sizes, progress=not args.json) for b in backends]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_report(results)
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
