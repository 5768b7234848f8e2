"""Storage that misbehaves: the catalog and a running job either ride through (retries)
or fail cleanly; a restart never loses or duplicates output; a failed checkpoint never
damages the previous one.

* S3: a seeded fault-injecting proxy (`tests.chaos.faultproxy`) in front of moto's
  server answers 500s, 503 SlowDown, drops connections before or after forwarding, and
  delays responses; catalog operations (fast, default run) and a real spark-submit job
  whose checkpoints go to S3 through it (a headline promise, in the default run),
  including an outage that makes the job fail.
* Local disk: a `Storage` wrapper around `LocalStorage` that fails writes with ENOSPC
  ("disk full") and other I/O errors by seeded schedule, under the checkpoint
  coordinator (no Spark; default run).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.metadata import sha256_hex
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.exceptions import SparkpointError, StorageError
from airflow_sparkpoint.runtime.checkpointer import Checkpointer
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.restore import materialize
from airflow_sparkpoint.storage import LocalStorage, ObjectInfo, Storage, open_storage
from tests.chaos.cases import JOB, job_script
from tests.chaos.faultproxy import KINDS, FaultProxy
from tests.chaos.harness import chaos_seed, compare, spark_submit, write_inputs
from tests.support.records import put_checkpoint, transaction_record
from tests.support.sink_cases import DeltaMergeCase

# ---------------------------------------------------------------------------- S3 through the proxy


@pytest.mark.s3
def test_catalog_rides_through_s3_faults(s3_server: str, s3_bucket: str) -> None:
    seed = chaos_seed()
    with FaultProxy(s3_server, seed=seed, rate=0.2, slow_s=0.3) as proxy:
        options = {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}
        catalog = Catalog.open(f"s3://{s3_bucket}/root", JOB, **options)
        generation = catalog.claim_generation().generation
        metas = []
        for batch in range(6):
            record = transaction_record("s3", batch, generation, {"batch": batch}, job=JOB,
                                        sink_id="s3://x/y")
            catalog.put_transaction(record)
            metas.append(put_checkpoint(catalog, {f"state/0/{i}/{batch + 1}.changelog":  # four state files
                                                  f"state {i} of batch {batch} ".encode() * (50 + i)
                                                  for i in range(4)},
                                        batch_id=batch))
            enforce_checkpoint_retention(catalog, 3)
            catalog.delete_transactions([record])
        savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
        channel = ControlChannel(catalog)
        request = channel.submit("savepoint", generation=generation, timeout_s=60)
        channel.acknowledge(request, generation)
        channel.complete(request, generation=generation, savepoint=savepoint.uri, batch_id=5)
        assert channel.result(request.id).state == "completed"
        assert catalog.latest() == metas[-1]
        injected = dict(proxy.injected)
        requests = proxy.requests
    print(f"seed {seed}: {requests} requests through the proxy, faults injected {injected}")
    # with the default seed: all five kinds
    assert sum(injected.values()) >= 10 and len(injected) >= 3, injected

    # Read back without the proxy: exactly what a fault-free run leaves.
    clean = Catalog.open(f"s3://{s3_bucket}/root", JOB, endpoint_url=s3_server, region_name="us-east-1")
    assert [m.id for m in clean.checkpoints()] == [m.id for m in metas[-3:]][::-1]
    assert clean.transactions() == []
    assert [e.valid for e in clean.list_savepoints()] == [True]
    assert clean.current_generation() == generation
    for meta in clean.checkpoints():
        for ref in meta.files:
            assert sha256_hex(clean.store.get(ref.key)) == ref.sha256


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(3600)
def test_job_checkpointing_to_flaky_s3_is_exact_after_restarts(
    s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    """The job's storage root is S3 behind the proxy (Spark writes its live checkpoint
    locally): with random faults it rides through or fails cleanly; an outage during the
    checkpoint of batch 2 makes it fail (the previous checkpoint stays valid); restarts
    with the same conf end with exact output."""
    seed = chaos_seed()
    case = DeltaMergeCase(tmp_path)
    expected = write_inputs(tmp_path / "input")
    root = f"s3://{s3_bucket}/root"
    direct = Catalog.open(root, JOB, endpoint_url=s3_server, region_name="us-east-1")
    with FaultProxy(s3_server, seed=seed, rate=0.1, slow_s=0.5) as proxy:
        conf = {
            "spark.sparkpoint.dir": root, "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.workDir": str(tmp_path / "work"), "spark.sparkpoint.restore": "latest",
            "spark.sparkpoint.s3.endpoint": proxy.endpoint, "spark.sparkpoint.s3.region": "us-east-1",
        }
        args = ["--input", str(tmp_path / "input"), "--output", case.output()]

        # 1. An outage starts when checkpoint 2 is about to be completed (of batch 1, or of a
        #    later one when the coordinator coalesced batches behind a slow store; checkpoint 1,
        #    of batch 0, always comes first).
        def outage(method: str, path: str) -> bool:
            return method == "PUT" and "/chk-2/_metadata" in path

        def trip(method: str, path: str) -> None:
            if outage(method, path):
                proxy.outage = True

        proxy.on_request = trip
        first = spark_submit(job_script(case), conf=conf, args=args, log=tmp_path / "try1.log")
        proxy.on_request, proxy.outage = None, False
        assert first.returncode != 0, "the job should fail when the storage root is down"
        failed = re.search(r"checkpoint of batch (\d+) failed", first.output)
        assert failed, first.tail()
        assert "Traceback" in first.output  # it failed, it did not hang
        latest = direct.latest()
        assert latest is not None and latest.id == 1, "the previous checkpoint must stay valid"
        assert latest.batch_id < int(failed.group(1))
        assert all(r["events"] <= latest.batch_id + 1 for r in case.rows()), \
            "nothing after the last complete checkpoint may be committed"

        # 2. Restarts (the Airflow retry: same conf) through random faults until one finishes.
        runs = [first]
        for attempt in range(2, 6):
            run = spark_submit(job_script(case), conf=conf, args=args, log=tmp_path / f"try{attempt}.log")
            runs.append(run)
            if run.returncode == 0:
                break
            assert "Traceback" in run.output, \
                f"try {attempt} neither finished nor failed cleanly:\n{run.tail()}"
        injected = dict(proxy.injected)
    print(f"seed {seed}: {len(runs)} runs, {proxy.requests} requests, faults injected {injected}")
    assert runs[-1].returncode == 0, runs[-1].tail()
    assert runs[-1].result and runs[-1].result["status"] == "finished"
    verdict = compare(case, expected, case.rows())
    assert verdict.exact, verdict.wrong
    assert case.leftovers(JOB) == [] and direct.transactions() == []
    assert sum(injected.get(k, 0) for k in KINDS) > 0, injected


# ---------------------------------------------------------------------------- a failing local disk


class FaultyStorage(Storage):
    """`LocalStorage` whose writes fail by schedule: ``ENOSPC`` (disk full) or ``EIO``.

    `schedule(op, key)` returns an errno to fail with, or None. A failing ``upload_file``
    or ``put`` may first leave a torn temp file behind, as a real full disk does.
    """

    WRITES = ("put", "put_if_absent", "upload_file", "copy", "delete")

    def __init__(self, root: str, schedule: Any = None) -> None:
        self.inner = LocalStorage(root)
        self.uri = self.inner.uri
        self.schedule = schedule or (lambda op, key: None)
        self.failures: Counter[str] = Counter()

    def _maybe_fail(self, op: str, key: str) -> None:
        code = self.schedule(op, key)
        if code is not None:
            self.failures[f"{op}:{errno.errorcode[code]}"] += 1
            raise StorageError(f"cannot write {self.uri}/{key}: {OSError(code, os.strerror(code))}")

    def put(self, key: str, data: bytes) -> None:
        self._maybe_fail("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._maybe_fail("put_if_absent", key)
        self.inner.put_if_absent(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return self.inner.get(key, max_bytes)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str = "") -> list[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            self._maybe_fail("delete", key)
            self.inner.delete([key])

    def copy(self, src: str, dst: str) -> None:
        self._maybe_fail("copy", dst)
        self.inner.copy(src, dst)

    def upload_file(self, local_path: str, key: str) -> None:
        self._maybe_fail("upload_file", key)
        self.inner.upload_file(local_path, key)

    def download_file(self, key: str, local_path: str) -> None:
        self.inner.download_file(key, local_path)


class LiveDir:
    """A hand-made Spark checkpoint location: offsets, commits, sources and state files
    of each batch, written the way Spark writes them (new files, never rewritten)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "metadata").parent.mkdir(parents=True, exist_ok=True)
        (root / "metadata").write_text('{"id":"q"}')

    def batch(self, batch_id: int, rng: random.Random) -> None:
        for name in (f"sources/0/{batch_id}", f"offsets/{batch_id}", f"commits/{batch_id}"):
            self._write(name, f"v1\n{name}\n".encode())
        for part in range(3):
            self._write(f"state/0/{part}/{batch_id + 1}.changelog", rng.randbytes(rng.randrange(100, 4000)))
        if batch_id % 3 == 2:
            self._write(f"state/0/0/{batch_id + 1}.zip", rng.randbytes(5000))

    def _write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def digest(self, upto_batch: int) -> dict[str, str]:
        from airflow_sparkpoint.runtime import livedir

        return {f.path: hashlib.sha256(Path(f.abspath).read_bytes()).hexdigest()
                for f in livedir.walk(str(self.root)) if livedir.needed_for_restart(f.path, upto_batch)}


def _coordinator(catalog: Catalog, live: Path, tolerable: int = 0) -> Checkpointer:
    fence = Fence(catalog, catalog.claim_generation().generation)
    committer = Committer(catalog=catalog, sink=None, fence=fence, commit_mode="checkpoint")  # type: ignore[arg-type]
    return Checkpointer(catalog=catalog, fence=fence, live_root=str(live), transactions=committer,
                        interval_s=0, num_retained=2, timeout_s=600, tolerable_failures=tolerable)


def _restores_exactly(catalog: Catalog, live: LiveDir, batch_id: int, where: Path) -> None:
    """The latest checkpoint is at `batch_id` and rebuilds the live files of that batch."""
    latest = catalog.latest()
    assert latest is not None and latest.batch_id == batch_id
    materialize(catalog.handle(latest), str(where))
    rebuilt = LiveDir.__new__(LiveDir)
    rebuilt.root = where
    assert rebuilt.digest(batch_id) == live.digest(batch_id)


def test_disk_full_fails_the_checkpoint_cleanly_and_keeps_the_previous_one(tmp_path: Path) -> None:
    armed: dict[str, int] = {}

    def schedule(op: str, key: str) -> int | None:
        if armed.get(op, 0) > 0:
            armed[op] -= 1
            return errno.ENOSPC
        return None

    store = FaultyStorage(str(tmp_path / "root"), schedule)
    catalog = Catalog(store, JOB)
    live = LiveDir(tmp_path / "live")
    rng = random.Random(chaos_seed())
    coordinator = _coordinator(catalog, live.root)
    live.batch(0, rng)
    assert coordinator.checkpoint(0) is not None

    live.batch(1, rng)
    for op in ("upload_file", "put_if_absent"):
        armed = {op: 1}
        with pytest.raises(SparkpointError, match="No space left on device"):
            coordinator.checkpoint(1)
        _restores_exactly(catalog, live, 0, tmp_path / f"restored-{op}")
    # Space is back: the same coordinator checkpoints batch 1 and stays incremental.
    meta = coordinator.checkpoint(1)
    assert meta is not None and meta.stats.files_copied < meta.stats.file_count
    _restores_exactly(catalog, live, 1, tmp_path / "restored-1")
    assert dict(store.failures) == {"upload_file:ENOSPC": 1, "put_if_absent:ENOSPC": 1}


def test_tolerable_failures_ride_through_a_full_disk(tmp_path: Path) -> None:
    full = {"on": False}
    store = FaultyStorage(str(tmp_path / "root"), lambda op, key: errno.ENOSPC if full["on"] else None)
    catalog = Catalog(store, JOB)
    live = LiveDir(tmp_path / "live")
    rng = random.Random(chaos_seed())
    coordinator = _coordinator(catalog, live.root, tolerable=2)
    live.batch(0, rng)
    coordinator.checkpoint(0)
    full["on"] = True
    for batch in (1, 2):
        live.batch(batch, rng)
        assert coordinator.checkpoint(batch) is None  # failed, tolerated, logged
    live.batch(3, rng)
    with pytest.raises(SparkpointError, match="3 consecutive failures exceed"):
        coordinator.checkpoint(3)
    _restores_exactly(catalog, live, 0, tmp_path / "restored-0")
    full["on"] = False
    assert coordinator.checkpoint(3) is not None
    _restores_exactly(catalog, live, 3, tmp_path / "restored-3")


def test_a_failing_retention_does_not_fail_a_completed_checkpoint(tmp_path: Path) -> None:
    deletes_fail = {"on": True}
    store = FaultyStorage(str(tmp_path / "root"),
                          lambda op, key: errno.EIO if op == "delete" and deletes_fail["on"] else None)
    catalog = Catalog(store, JOB)
    live = LiveDir(tmp_path / "live")
    rng = random.Random(chaos_seed())
    coordinator = _coordinator(catalog, live.root, tolerable=0)
    for batch in range(4):
        live.batch(batch, rng)
        assert coordinator.checkpoint(batch) is not None, f"checkpoint of batch {batch}"
    assert store.failures["delete:EIO"] >= 1
    assert len(catalog.checkpoints()) == 4  # nothing could be collected
    deletes_fail["on"] = False
    live.batch(4, rng)
    coordinator.checkpoint(4)
    assert [m.batch_id for m in catalog.checkpoints()] == [4, 3]  # numRetained=2, garbage gone
    _restores_exactly(catalog, live, 4, tmp_path / "restored")


def test_random_write_faults_never_damage_the_latest_valid_checkpoint(tmp_path: Path) -> None:
    """Seeded: 40 batches, each write (uploads, _metadata, retention deletes) failing with
    probability 0.05 (ENOSPC or EIO). After every attempt the latest valid checkpoint
    restores exactly the live files of its batch, and is never older than before."""
    seed = chaos_seed()
    rng = random.Random(seed)
    faults = random.Random(seed + 1)

    def schedule(op: str, key: str) -> int | None:
        if faults.random() < 0.05:
            return faults.choice((errno.ENOSPC, errno.EIO))
        return None

    store = FaultyStorage(str(tmp_path / "root"), schedule)
    catalog = Catalog(store, JOB)
    live = LiveDir(tmp_path / "live")
    coordinator = _coordinator(catalog, live.root, tolerable=1000)
    newest = -1
    outcomes: Counter[str] = Counter()
    for batch in range(40):
        live.batch(batch, rng)
        meta = coordinator.checkpoint(batch)
        latest = catalog.latest()
        outcomes["completed" if latest is not None and latest.batch_id == batch else "failed"] += 1
        assert latest == meta if meta is not None else latest is None or latest.batch_id < batch
        if latest is not None:
            assert latest.batch_id >= newest
            newest = latest.batch_id
            _restores_exactly(catalog, live, newest, tmp_path / f"restored-{batch}")
    print(f"seed {seed}: checkpoints {dict(outcomes)}, write faults {dict(store.failures)}")
    assert outcomes["completed"] >= 5 and outcomes["failed"] >= 1, outcomes
    assert newest >= 20


def test_a_real_disk_full_leaves_no_torn_or_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC in the middle of LocalStorage's own copy: the object never appears, torn,
    under its key, and no temp file is left to fill the disk further."""
    from airflow_sparkpoint.storage import _localfs_fd

    real_copy = _localfs_fd.copy
    fired = []

    def copy_half(src: int, dst: int) -> None:
        data = os.read(src, 1 << 20)
        os.write(dst, data[: len(data) // 2])
        fired.append(dst)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(100_000))
    store = open_storage(str(tmp_path / "root"))
    store.put("keep", b"previous")
    monkeypatch.setattr(_localfs_fd, "copy", copy_half)
    with pytest.raises(StorageError, match="No space left on device"):
        store.upload_file(str(source), "shared/big.bin")
    monkeypatch.setattr(_localfs_fd, "copy", real_copy)
    assert fired, "the disk-full fault never fired: the copy no longer goes through _localfs_fd.copy"
    assert not store.exists("shared/big.bin")
    leftovers = [p.name for p in (tmp_path / "root").rglob("*") if p.is_file() and p.name != "keep"]
    assert leftovers == [], f"temporary files left behind after ENOSPC: {leftovers}"
