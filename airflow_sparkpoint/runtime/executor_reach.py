"""Do the executors see the live location? A check the runtime runs before anything is written.

Spark's executors write their state files into the live checkpoint location and the
driver captures them from it, so on a cluster of several hosts it must be one filesystem
that the driver and every executor reach at the same path (a shared mount: NFS, EFS...).
An executor that sees a different directory at that path (its own disk) would write its
state where no checkpoint ever finds it. So, before a run claims anything, the driver
writes a probe file into the live location and runs one small Spark job with one task
per executor slot, all launched at once (barrier mode, so every executor registered at
that moment takes part): each task reads the driver's probe and writes its own, which the
driver reads back. Any mismatch refuses the run, naming the path and the executor.

Executors registered later (dynamic allocation, a replaced worker) are not checked;
``spark.scheduler.minRegisteredResourcesRatio=1.0`` with ``spark.cores.max`` or
``spark.executor.instances`` makes Spark wait for all of them first.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.config import PREFIX
from airflow_sparkpoint.storage.localfs import Dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_WAIT_S", "DRIVER_FILE", "PROBE_PREFIX", "SPARK_WAIT_KEY", "Executor",
           "check_executors_reach", "executors", "wait_seconds"]

log = logging.getLogger(__name__)

PROBE_PREFIX = ".sparkpoint-probe-"  # hidden: never captured (`livedir.walk` skips it)
DRIVER_FILE = "driver"
#: a probe holds a token and an address (read bounded: the work directory is shared)
_PROBE_MAX_BYTES = 4096
#: how long to wait for the executors the application asked for (``spark.executor.instances``
#: / ``spark.cores.max``), or for a first one; longer when Spark's own
#: ``spark.scheduler.maxRegisteredResourcesWaitingTime`` is (queued YARN or autoscaled pods)
DEFAULT_WAIT_S = 60.0
SPARK_WAIT_KEY = "spark.scheduler.maxRegisteredResourcesWaitingTime"


def wait_seconds(conf: Any) -> float:
    """How long the check waits for executors: `DEFAULT_WAIT_S`, or Spark's
    `SPARK_WAIT_KEY` of `conf` (a SparkConf or mapping) when that is longer."""
    value = conf.get(SPARK_WAIT_KEY, None)
    try:
        spark_s = durations.parse_text(value) if value else 0.0
    except ValueError:
        spark_s = 0.0  # Spark itself refuses a malformed value at start-up
    return max(DEFAULT_WAIT_S, spark_s)


@dataclass(frozen=True)
class Executor:
    id: str
    host_port: str
    cores: int

    @property
    def host(self) -> str:
        return self.host_port.rpartition(":")[0] or self.host_port


def executors(spark: SparkSession) -> list[Executor]:
    """The active executors of this application (never the driver), from Spark's status
    store (what its REST API ``/executors`` serves; private in Scala, so read here only)."""
    store = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]
    summaries = store.executorList(True)
    found = []
    for index in range(summaries.size()):
        summary = summaries.apply(index)
        if summary.id() != "driver" and summary.isActive():
            found.append(Executor(str(summary.id()), str(summary.hostPort()), int(summary.totalCores())))
    return found


def _wanted(spark: SparkSession) -> tuple[int | None, int | None]:
    """(executors, cores) the application asked for, when it said."""
    conf = spark.sparkContext.getConf()
    instances = conf.get("spark.executor.instances")
    cores = conf.get("spark.cores.max")
    return (int(instances) if instances else None, int(cores) if cores else None)


def _wait_executors(spark: SparkSession, timeout_s: float) -> list[Executor]:
    """The registered executors once at least one is there and, when the application
    asked for a number of executors or cores, once they all are (bounded by `timeout_s`)."""
    instances, cores = _wanted(spark)
    deadline = time.monotonic() + timeout_s
    while True:
        found = executors(spark)
        enough = bool(found) and (instances is None or len(found) >= instances) and \
            (cores is None or sum(e.cores for e in found) >= cores)
        if enough or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def _open_probe(probe_dir: str) -> Dir:
    """The probe directory, open (its own name not followed: it is in the shared work root)."""
    return Dir.open(probe_dir, anchor=os.path.dirname(probe_dir))


def _probe_task(probe_dir: str, token: str):  # type: ignore[no-untyped-def]
    """The function each barrier task runs on its executor: read the driver's probe, write
    its own (named by its partition), report what it saw."""

    def run(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        address = context.getTaskInfos()[partition].address
        report = {"partition": partition, "address": address, "error": None}
        try:
            with _open_probe(probe_dir) as probe:
                seen = probe.read(DRIVER_FILE, _PROBE_MAX_BYTES).decode("utf-8", errors="replace")
                if seen != token:
                    report["error"] = (f"it reads {seen!r} in the driver's probe file, "
                                       f"the driver wrote {token!r}")
                else:
                    probe.write(f"task-{partition}", f"{token} {address}".encode(), fsync=False)
        except (OSError, ValueError) as exc:  # a link or a FIFO planted there is refused (ValueError)
            report["error"] = f"{type(exc).__name__}: {exc}"
        yield json.dumps(report)

    return run


def check_executors_reach(spark: SparkSession, location: str, *,
                          timeout_s: float | None = None) -> list[Executor]:
    """Refuse the run unless every executor sees `location` (a local path) as the driver
    does; returns the executors checked (none in local mode, where the driver is the
    executor).

    :raises ConfigError: an executor does not see the driver's probe file in `location`,
        or the driver does not see the file an executor wrote there (the message names
        the path, the executor and its host), or no executor registered in time.
    """
    sc = spark.sparkContext
    if str(sc.master).startswith("local"):
        return []
    if sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        log.warning("live location %s: executors are started on demand (dynamic "
                    "allocation), so the check that "
                    "every executor sees it at the same path does not run; use a shared mount on every host",
                    location)
        return []
    timeout_s = wait_seconds(sc.getConf()) if timeout_s is None else timeout_s
    found = _wait_executors(spark, timeout_s)
    if not found:
        raise ConfigError(f"no Spark executor registered within {timeout_s:.0f} s (master {sc.master}; a "
                          f"longer {SPARK_WAIT_KEY} waits longer); cannot check that the executors see "
                          f"{PREFIX}workDir {location}")
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    slots = max(1, sum(e.cores // task_cpus for e in found))  # as Spark counts them: all launched at once
    name = PROBE_PREFIX + uuid.uuid4().hex
    probe_dir = os.path.join(location, name)
    token = uuid.uuid4().hex
    root = Dir.open(location, create=True)
    try:
        root.makedirs(name)
        with root.sub(name) as probe:
            probe.write(DRIVER_FILE, token.encode(), fsync=False)
        previous = sc.getLocalProperty("spark.job.description")
        sc.setJobDescription(f"sparkpoint: do the executors see {location}?")
        try:
            reports = [json.loads(line) for line in sc.parallelize(range(slots), slots).barrier()
                       .mapPartitions(_probe_task(probe_dir, token)).collect()]
        finally:
            sc.setJobDescription(previous)  # type: ignore[arg-type]
        problems = _problems(reports, found, probe_dir, token)
    finally:
        root.remove_tree(name)
        root.close()
    if problems:
        raise ConfigError(
            f"{PREFIX}workDir {location} is not the same directory on the driver and every executor: "
            + "; ".join(problems)
            + ". The live checkpoint location must be a filesystem that the driver and "
              "every executor reach at "
            "the same path (a shared mount such as NFS or EFS on every host); nothing was written"
        )
    log.info("live location %s: the driver and %d executor(s) see it (%s)", location, len(found),
             ", ".join(f"{e.id}@{e.host}" for e in found))
    return found


def _problems(reports: list[dict[str, Any]], found: list[Executor], probe_dir: str, token: str) -> list[str]:
    """What went wrong, per task. A barrier task knows its executor's RPC address, not its
    id (Spark's status store has the block manager's port): tasks are named by address."""

    def name(address: str) -> str:
        host = address.rpartition(":")[0] or address
        return f"the executor at {address} (host {host})"

    problems = []
    for report in sorted(reports, key=lambda r: r["partition"]):
        if report["error"]:
            problems.append(f"{name(report['address'])} does not see the driver's probe "
                            f"{os.path.join(probe_dir, DRIVER_FILE)} ({report['error']})")
            continue
        path = os.path.join(probe_dir, f"task-{report['partition']}")
        try:
            with _open_probe(probe_dir) as probe:
                seen = probe.read(f"task-{report['partition']}",
                                  _PROBE_MAX_BYTES).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            seen = None
        if seen != f"{token} {report['address']}":
            problems.append(f"the driver does not see the probe {path} that {name(report['address'])} wrote")
    probed = {r["address"].rpartition(":")[0] for r in reports}
    problems += [f"executor {e.id} on host {e.host} ran no probe task" for e in found if e.host not in probed]
    return problems
