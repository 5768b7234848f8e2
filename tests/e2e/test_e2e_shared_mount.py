"""More than one host: Spark standalone workers that each run in a mount namespace of their
own (`mountns.private_tmp`: a private /tmp), seeing the live checkpoint location only
through a bind mount at the same path, as every host of a cluster sees a shared NFS/EFS
mount. The retained checkpoints (``spark.sparkpoint.dir``) are on the driver's side only.

* a job whose executors write their state through the bind mounts is SIGKILLed after a
  confirmed batch and restarted: the output is exact;
* a worker that does not have the bind mount (its own empty directory at that path) makes
  the job fail before anything is written, with a message naming the path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.storage import open_storage
from tests.e2e import mountns
from tests.e2e.cluster import SparkCluster
from tests.support.race_drivers import (
    JOB,
    Driver,
    args,
    delta_version,
    diff,
    expected_rows,
    job_conf,
    table_rows,
    write_inputs,
)

pytestmark = [pytest.mark.spark]

FILES = 4


@dataclass
class Hosts:
    cluster: SparkCluster
    base: Path
    stash: Path

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    @property
    def live(self) -> Path:
        return self.shared / "live"

    def worker(self, name: str, *, sees_live: bool) -> None:
        """A worker on a "host" of its own: private /tmp, the shared input and table, and
        the live location through a bind mount (or its own empty directory there)."""
        shared = [self.shared / "input", self.shared / "table"] + ([self.live] if sees_live else [])
        private = [self.cluster.base / name, self.cluster.base / "logs"] + ([] if sees_live else [self.live])
        self.cluster.start_worker(name, prefix=mountns.private_tmp(self.stash, shared, private))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = mountns.available()
    assert reason is None, reason  # root and unshare are part of this suite's environment
    base = tmp_path_factory.mktemp("shared-mount")
    assert mountns.TMP in base.parents, f"{base} must be under /tmp for a private /tmp to hide it"
    for name in ("input", "table", "live"):
        (base / "shared" / name).mkdir(parents=True)
    write_inputs(base / "shared" / "input", FILES)  # either test alone has input to write out
    stash = Path(tempfile.mkdtemp(prefix="sparkpoint-mountns-", dir="/var/tmp"))
    cluster = SparkCluster(base=base / "cluster", workers=0)
    try:
        cluster.start()
        hosts = Hosts(cluster, base, stash)
        for index in range(2):
            hosts.worker(f"worker-{index}", sees_live=True)
        cluster.wait_workers(2)
        yield hosts
    finally:
        cluster.stop()  # SIGKILLs every process by pid: their namespaces end with them
        os.rmdir(stash)


def start(hosts: Hosts, tmp_path: Path, name: str, *, cores: int, fault: str | None = None) -> Driver:
    conf = job_conf(tmp_path / "store", {"workDir": str(hosts.live)})
    options = ["--conf", "spark.driver.host=127.0.0.1", "--conf", f"spark.cores.max={cores}",
               "--conf", "spark.executor.cores=1", "--conf", "spark.executor.memory=512m"]
    return Driver(name, tmp_path, conf, args(hosts.shared), fault=fault, master=hosts.cluster.url,
                  options=options)


def in_own_namespace(pid: int, path: Path) -> bool:
    """Whether process `pid` has a mount namespace of its own in which `path` is not seen."""
    return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt") and \
        not Path(f"/proc/{pid}/root{path}").exists()


@pytest.mark.slow  # two drivers on the cluster (~1.5 min here): `make test-all` / `make test-e2e`
def test_workers_in_their_own_mount_namespaces_share_the_live_location_and_a_sigkilled_job_restarts_exactly(
    hosts: Hosts, tmp_path: Path, request: Any
) -> None:
    for name, proc in hosts.cluster.worker_procs.items():
        assert in_own_namespace(proc.pid, tmp_path), f"{name} sees the test's /tmp"
        assert Path(f"/proc/{proc.pid}/root{hosts.live}").is_dir()
    drivers: list[Driver] = []
    request.addfinalizer(lambda: [driver.stop() for driver in drivers])

    killed = start(hosts, tmp_path, "killed", cores=2, fault="confirmed:2")
    drivers.append(killed)
    assert killed.wait() != 0, killed.tail()
    assert killed.fault_marker.read_text().strip() == "confirmed:2", killed.tail()
    assert "the driver and 2 executor(s) see it" in killed.output, killed.tail()
    state = [p for p in hosts.live.rglob("*") if "/state/" in str(p) and p.is_file()]
    assert state, f"no state file in {hosts.live}: the executors wrote none through the bind mount"

    restarted = start(hosts, tmp_path, "restarted", cores=2)
    drivers.append(restarted)
    assert restarted.wait() == 0, restarted.tail()
    result = restarted.result
    assert result is not None and result["status"] == "finished" and result["last_batch"] == FILES - 1, result
    problems = diff(expected_rows(hosts.shared / "input"), table_rows(hosts.shared / "table"))
    assert not problems, problems


# slow (51 s with its namespaced cluster): the default run checks the same refusal without a
# cluster (tests/unit/runtime/test_reach.py); `make test-e2e` / `make test-all` run it
@pytest.mark.slow
def test_a_worker_without_the_shared_mount_fails_the_job_before_anything_is_written(
    hosts: Hosts, tmp_path: Path
) -> None:
    hosts.worker("worker-unshared", sees_live=False)
    try:
        hosts.cluster.wait_workers(3)
        table = hosts.shared / "table"  # the first test's output, if it ran: nothing may be added to it
        version, before = delta_version(table), sorted(p.name for p in hosts.live.iterdir())
        driver = start(hosts, tmp_path, "unshared", cores=3)
        try:
            code = driver.wait()
        finally:
            driver.stop()
        assert code != 0, driver.tail()
        output = driver.output
        assert (f"spark.sparkpoint.workDir {hosts.live} is not the same directory on the driver "
                "and every executor" in output), driver.tail()
        assert output.count("does not see the driver's probe") == 1, driver.tail()  # the two others see it
        catalog = Catalog(open_storage(str(tmp_path / "store")), JOB)
        assert catalog.current_generation() == 0 and catalog.list_checkpoints() == []
        assert delta_version(table) == version and not list((tmp_path / "store").rglob("*.json"))
        assert sorted(p.name for p in hosts.live.iterdir()) == before, "the probe was left behind"
    finally:
        hosts.cluster.kill_worker("worker-unshared")
        del hosts.cluster.worker_procs["worker-unshared"]
        shutil.rmtree(hosts.cluster.base / "worker-unshared", ignore_errors=True)
