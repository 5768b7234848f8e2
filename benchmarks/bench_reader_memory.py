"""Memory of the store's readers over a store that holds the largest record each kind
allows (a target of docs/BENCHMARKS.md, DESIGN.md §6: "any reader of the store (CLI,
page, sensor, trigger) at most 256 MiB above its baseline, whatever the store holds").

The script fills one job's store, on local disk and on a moto S3 server it starts, with
what a writer of the store can plant within the limits readers accept
(`checkpoints.layout.RECORD_MAX_BYTES` / `RECORD_MAX_COST`):

* ``--checkpoints`` checkpoints and ``--savepoints`` savepoints: most with a ``_metadata``
  of a big RocksDB job at the byte limit (~75,000 files), two per kind at the parse-cost
  limit in the shape whose parse costs most per estimated byte (one long string with an
  astral character: 4 bytes per character, twice), each with a drill record at its limit;
* the status records, the counters, the commit head at their limits (free text with an
  astral character);
* ``--generations`` generation claims and run results at their limits (a claim's details
  a nested object at the cost limit);
* an origin per generation, ``--transactions`` transaction records at the byte limit
  (an S3 batch of 1,000-part uploads) and ``--requests`` control requests.

Then it runs each reader in a fresh subprocess and reports the peak resident memory
above that process's baseline (after its imports, before its read; Linux ``VmHWM`` reset
through ``/proc/self/clear_refs``):

* ``sparkpoint list --json`` (the CLI);
* the checkpoints page's read model and HTML (`load_history`, `plugins.page.pipeline_page`);
* a sensor poke / trigger poll (`services.conditions.evaluate`, what both run).

Ratio = peak ÷ 256 MiB (target ≤ 1.0). ``--reader-path DIR`` runs the readers with the
package at DIR first on ``sys.path`` (an older checkout, for before/after figures); the
store is filled by this checkout.

    .venv/bin/python benchmarks/bench_reader_memory.py [--backends local,s3] [--checkpoints 10]
        [--savepoints 3] [--generations 20] [--transactions 5] [--requests 10] [--reader-path DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import emit, machine

REPO = Path(__file__).resolve().parents[1]
JOB = "orders"
MIB = 1 << 20
TARGET_MIB = 256
READERS = ("list", "page", "sensor")


# ---------------------------------------------------------------------------- filling the store


def _astral_text(limit_bytes: int, overhead: int = 512) -> str:
    """ASCII text of about `limit_bytes` with one astral character: parsed, every character
    takes 4 bytes (and 4 more in the decoded document), the costliest text per byte."""
    return "\U0001f600" + "e" * max(0, limit_bytes - overhead)


def _fits(data: bytes, key: str) -> bool:
    from airflow_sparkpoint.checkpoints import bounded, layout

    limits = layout.limits_of(key)
    return len(data) <= limits.max_bytes and bounded.parse_cost(data) <= limits.max_cost


def _largest(key: str, make: Any) -> bytes:
    """The largest ``make(size)`` (bytes) readers accept at `key`: a binary search on size."""
    from airflow_sparkpoint.checkpoints import layout

    low, high = 0, layout.limits_of(key).max_bytes
    best = make(0)
    while low <= high:
        middle = (low + high) // 2
        data = make(middle)
        if _fits(data, key):
            best, low = data, middle + 1
        else:
            high = middle - 1
    return best


def big_metadata(kind: str, sid: int, files: int) -> bytes:
    """A valid ``_metadata`` of a RocksDB job with `files` SST files (they are not stored:
    the snapshot reads as incomplete, after its whole ``_metadata`` was parsed)."""
    from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata

    refs = []
    for i in range(files):
        path = f"state/{i % 4}/{i // 4 % 200}/SSTs/{i:06d}-{uuid.UUID(int=i)}.sst"
        key = f"shared/{path}~{i:016x}" if kind == "checkpoint" else f"files/{path}"
        refs.append(FileRef(path, key, 64 * MIB, f"{i:064x}", 1_790_000_000_123_456_789))
    return SnapshotMetadata(kind, sid, JOB, 1, sid * 10, time.time(), tuple(refs)).to_bytes()  # type: ignore[arg-type]


def fill(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Plant the largest records in `store` (a job's storage); return what was planted."""
    from airflow_sparkpoint.checkpoints import layout
    from airflow_sparkpoint.checkpoints.run_result import result_key

    planted: dict[str, int] = {}

    def put(key: str, data: bytes) -> None:
        assert _fits(data, key), f"{key} would be refused"
        store.put(key, data)
        name = key.rsplit("/", 1)[-1]
        kind = name if name in (layout.METADATA, layout.VERIFICATION) else key.split("/")[0]
        planted[kind] = planted.get(kind, 0) + len(data)

    meta_key = layout.checkpoint_metadata(1)
    files = 1000
    while _fits(big_metadata("checkpoint", 1, files * 2), meta_key):
        files *= 2
    low, high = files, files * 2
    while high - low > 500:
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(big_metadata("checkpoint", 1,
                                                         middle), meta_key) else (low, middle)
    files = low
    costly_meta = _largest(meta_key,
                           lambda n: json.dumps({"pad": _astral_text(n)}, ensure_ascii=False).encode())
    drill = _largest("chk-1/_verification.json", lambda n: json.dumps(
        {"schema_version": 1, "verified_at": 1.0, "level": "drill", "duration_s": 1.0, "checks": {},
         "error": _astral_text(n), "verified_by": "x"}, ensure_ascii=False).encode())
    jobs = []
    for i in range(1, args.checkpoints + 1):
        costly = i <= 2
        jobs.append((layout.checkpoint_metadata(i),
                     costly_meta if costly else big_metadata("checkpoint", i, files)))
        jobs.append((f"chk-{i}/_verification.json", drill))
    for i in range(1, args.savepoints + 1):
        directory = layout.savepoint_dir(1000 + i, f"{i:08x}")
        costly = i <= 2
        jobs.append((f"{directory}/_metadata",
                     costly_meta if costly else big_metadata("savepoint", 1000 + i, files)))
        jobs.append((f"{directory}/_verification.json", drill))
    for key, data in jobs:
        put(key, data)

    status = _largest("status.json", lambda n: json.dumps(
        {"job": JOB, "generation": args.generations, "state": "running", "started_at": time.time(),
         "heartbeat_at": time.time(), "error": _astral_text(n)}, ensure_ascii=False).encode())
    put(layout.STATUS, status)
    put(layout.status_key(args.generations), status)
    put(layout.COUNTERS, _largest(layout.COUNTERS, lambda n: json.dumps(
        {"schema_version": 1, "completed": 1, "trend": [[i, i, 1.5, 1, 1, 1] for i in range(n // 40)],
         "recent": [[1.5, True]] * (n // 40)}).encode()))
    put(layout.COMMITTED, _largest(layout.COMMITTED, lambda n: json.dumps(
        {"schema_version": 1, "seq": 1, "job": JOB, "batch": 1, "generation": 1, "txn_id": _astral_text(n),
         "sink_id": "x"}, ensure_ascii=False).encode()))
    for g in range(1, args.generations + 1):
        claim_key = layout.generation_key(g)
        put(claim_key, _largest(claim_key, lambda n, g=g: json.dumps(
            {"generation": g, "started_at": time.time(), "host": "h", "pid": 1,
             "details": {"config": {f"k{i}": [i, {"v": 1.5}] for i in range(n // 40)}}}).encode()))
        put(result_key(g), _largest(result_key(g), lambda n, g=g: json.dumps(
            {"status": "finished", "job": JOB, "generation": g, "committed_batches": list(range(n // 8)),
             "recovered": {"aborted": [1.5] * (n // 8)}}).encode()))
        put(layout.lineage_key(g), _largest(layout.lineage_key(g), lambda n, g=g: json.dumps(
            {"generation": g, "kind": "empty", "uri": None, "base_id": -1,
             "restore": {f"k{i}": 1.5 for i in range(n // 12)}}).encode()))
    parts = [[n, f'"{n:032x}"'] for n in range(1, 1001)]  # a 5 GiB file in 1,000 parts
    batch = _largest(layout.txn_key(1, 1), lambda n: json.dumps(
        {"schema_version": 1, "job": JOB, "batch_id": 1, "generation": 1, "sink": "s3", "sink_id": "s3://b/out",
         "payload": {"staged": {"uploads": [{"key": f"out/part-{JOB}-b1-g1-{i:05d}.parquet",
                                             "upload_id": "u" * 100,
                                              "size": 5 << 30, "rows": 1, "parts": parts}
                                             for i in range(n // 40_000)]}}}).encode())
    for b in range(1, args.transactions + 1):  # the same record for other single-digit batches
        put(layout.txn_key(b, 1), batch.replace(b"-b1-g1-", f"-b{b}-g1-".encode())
            .replace(b'"batch_id": 1,', f'"batch_id": {b},'.encode()))
    for r in range(args.requests):
        request_id = f"{1_700_000_000_000 + r:013d}-{r:08x}"
        key = f"control/{request_id}.request.json"
        put(key, _largest(key, lambda n, rid=request_id: json.dumps(
            {"schema_version": 1, "id": rid, "kind": "savepoint", "job": JOB, "created_at": time.time(),
             "deadline": time.time() + 3600, "requested_by": _astral_text(n)}, ensure_ascii=False).encode()))
    return {"files_per_metadata": files, "bytes_by_kind": planted}


# ---------------------------------------------------------------------------- the readers


READER = r"""
import json, os, resource, sys
def rss(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0
mode, root, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import logging; logging.disable(logging.WARNING)
from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.plugins import page
from airflow_sparkpoint.storage import open_storage
from airflow_sparkpoint.services.conditions import CheckpointCondition, evaluate
catalog = Catalog(open_storage(root, **options), "orders")
catalog.store.list_dirs("")  # the client is made before the baseline
try:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current RSS
except OSError:
    pass
baseline = rss("VmRSS:")
if mode == "list":
    args = ["list", "--dir", root, "--job", "orders", "--json"]
    if options.get("endpoint_url"):
        args += ["--s3-endpoint", options["endpoint_url"], "--s3-region", "us-east-1"]
    sys.stdout = open(os.devnull, "w")
    main(args)
elif mode == "page":
    history = load_history(catalog)
    html = page.pipeline_page(history.to_json(), "sp", "")
    json.dumps(history.to_json())
else:
    evaluate(catalog, CheckpointCondition(job_name="orders", min_checkpoints=1))
peak = rss("VmHWM:")
import airflow_sparkpoint
sys.__stdout__.write(json.dumps({"baseline": baseline, "peak": peak,
                                 "package": airflow_sparkpoint.__file__}) + "\n")
"""


def measure(mode: str, root: str, options: dict[str, Any], reader_path: str | None) -> dict[str, Any]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    if reader_path:
        env["PYTHONPATH"] = os.pathsep.join([reader_path, env.get("PYTHONPATH", "")])
    started = time.monotonic()
    # Not run from the checkout: "-c" puts the working directory first on sys.path.
    proc = subprocess.run([sys.executable, "-c", READER, mode, root, json.dumps(options)], env=env,
                          cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=3600,
                          check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    above = max(0, figures["peak"] - figures["baseline"])
    return {"baseline_mib": round(figures["baseline"] / MIB, 1), "peak_above_mib": round(above / MIB, 1),
            "ratio": round(above / (TARGET_MIB * MIB), 3), "seconds": round(time.monotonic() - started, 1),
            "package": str(Path(figures["package"]).parent)}


def backend(name: str, tmp: str) -> tuple[str, dict[str, Any], Any]:
    """(storage root, options, a stop function) of one backend."""
    if name == "local":
        return os.path.join(tmp, "store"), {}, lambda: None
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "test",
               "aws_secret_access_key": "test"}
    bucket = f"mem-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", **options).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/root", options, server.stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--savepoints", type=int, default=3)
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--transactions", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--reader-path", default=None, help="run the readers with this package path first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.storage import open_storage

    results: dict[str, Any] = {}
    heading = ("Peak RSS above baseline of each reader, over a store of the largest records each kind allows "
               f"(target <= {TARGET_MIB} MiB):")
    lines = [heading]
    if args.reader_path:
        lines.append(f"  readers run with the package at {args.reader_path}")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="sparkpoint-reader-memory-") as tmp:
        for name in args.backends.split(","):
            root, options, stop = backend(name, tmp)
            try:
                catalog = Catalog(open_storage(root, **options), JOB)
                started = time.monotonic()
                planted = fill(catalog.store, args)
                lines.append(f"  {name}: planted {sum(planted['bytes_by_kind'].values()) / MIB:.0f} MiB in "
                             f"{time.monotonic() - started:.0f} s (a big _metadata lists "
                             f"{planted['files_per_metadata']:,} files)")
                results[name] = {"planted": planted}
                with ThreadPoolExecutor(max_workers=1) as pool:  # one reader at a time
                    for mode in READERS:
                        figures = pool.submit(measure, mode, root, options, args.reader_path).result()
                        results[name][mode] = figures
                        if "error" in figures:
                            lines.append(f"    {mode:7s} ERROR {figures['error']}")
                            worst = max(worst, float("inf"))
                            continue
                        worst = max(worst, figures["ratio"])
                        lines.append(f"    {mode:7s} {figures['peak_above_mib']:8.1f} "
                                     "MiB above a baseline of "
                                     f"{figures['baseline_mib']:.0f} MiB  (ratio {figures['ratio']:.2f}, "
                                     f"{figures['seconds']:.0f} s)")
            finally:
                stop()
    result = {"benchmark": "reader_memory", "machine": machine(), "target_mib": TARGET_MIB,
              "results": results, "worst_ratio": worst, "pass": worst <= 1.0,
              "summary": f"worst reader peak / {TARGET_MIB} MiB = {worst:.2f} (target <= 1.0)"}
    emit(result, args.json, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
