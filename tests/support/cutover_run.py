"""One zero-downtime cutover with real drivers, the caller as the orchestrator
(issue 49): blue (``jobs/shadow_totals.py`` by ``spark-submit``, ``processingTime``,
Delta append) runs while input arrives; the orchestrator plans a cutover from blue's
newest checkpoint K, starts green in this process (its code counts every amount twice)
as the cutover's shadow (``spark.sparkpoint.shadow.*`` and ``spark.sparkpoint.cutover``),
waits until green is within the plan's lag of blue, agrees N ahead of blue, asks blue to
stop after N (`services.cutover.stop_after_batch`), lets green take the job over,
waits for green's `done: committed` after its commit of N+1 and finally stops green. The test
(`tests/integration/test_cutover_e2e.py`) and the benchmark
(``benchmarks/bench_cutover_gap.py``) use it."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import (
    CutoverPlan,
    CutoverStore,
    ProgressSighting,
    new_cutover_id,
    sighting_of,
)
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.demo.support import SPARK_CONF, delta_history, write_batch_file
from airflow_sparkpoint.services.cutover import stop_after_batch
from tests.support.shadow_totals import JOB_SCRIPT, job_module, rows_of
from tests.support.submit import spark_submit_command, start_spark_submit, submit_env
from tests.support.waits import wait_for

__all__ = ["JOB", "TRIGGER_S", "CutoverRun", "Feeder", "blue_conf", "commit_gap", "run_cutover",
           "sparkpoint_commits", "users_of"]

JOB = "totals"
TRIGGER_S = 1.0


def users_of(index: int) -> tuple[str, ...]:
    """The users of input file (= batch) `index`: one to three of u0..u6."""
    return tuple(sorted({f"u{(index * 3 + j) % 7}" for j in range(1 + index % 3)}))


class Feeder:
    """Writes input file i (one batch of blue's) every `pace_s` seconds from its own
    thread until `rush`: then every file through a given index at once."""

    def __init__(self, directory: Path, pace_s: float) -> None:
        self.directory, self.pace_s = directory, pace_s
        self.files: list[tuple[str, ...]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="feeder", daemon=True)

    def write_next(self) -> int:
        with self._lock:
            index = len(self.files)
            users = users_of(index)
            write_batch_file(self.directory, index, rows_of(index, users))
            self.files.append(users)
            return index

    def start(self, first: int) -> None:
        for _ in range(first):
            self.write_next()
        self._thread.start()

    def _feed(self) -> None:
        while not self._stop.wait(self.pace_s):
            self.write_next()

    def rush(self, through: int) -> None:
        """Stop pacing; write every file through index `through` now."""
        self._stop.set()
        self._thread.join(30)
        while len(self.files) <= through:
            self.write_next()


def blue_conf(root: Path, retained: int = 100) -> dict[str, str]:
    """Blue's settings: every batch checkpointed and kept (green warms up from one)."""
    return {**SPARK_CONF, "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.trigger": f"processingTime:{TRIGGER_S:g}s",
            "spark.sparkpoint.control.pollInterval": "0.3s",
            "spark.sparkpoint.checkpoint.numRetained": str(retained)}


@dataclass
class CutoverRun:
    """What happened: the input files, the cutover, K and N, blue's generation and exit
    code, green's result (or error), the table's Sparkpoint commits, and when."""

    base: Path
    files: list[tuple[str, ...]]
    cutover_id: str
    k: int
    n: int
    blue_generation: int
    blue_exit: int
    stop_request: str
    green_result: Any = None
    green_error: BaseException | None = None
    commits: list[dict[str, Any]] = field(default_factory=list)
    log: Path | None = None
    #: (monotonic time, what the caller's probe returned) at ``green_start`` (green's run
    #: starts beside blue), ``blue_exit`` (blue's driver ended) and ``green_end``
    marks: dict[str, tuple[float, Any]] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.base / "blue" / "checkpoints"

    @property
    def output(self) -> Path:
        return self.base / "blue" / "output"

    @property
    def catalog(self) -> Catalog:
        return Catalog.open(str(self.root), JOB)


def commit_gap(commits: list[dict[str, Any]], n: int) -> tuple[float, int]:
    """(seconds from the commit of batch `n` to the commit of `n` + 1 in the table's
    history, trigger intervals in it without a commit)."""
    at = {c["batch"]: c["timestamp"] for c in commits}
    gap = (at[n + 1] - at[n]) / 1000.0
    return gap, max(0, math.ceil(gap / TRIGGER_S) - 1)


def sparkpoint_commits(output: Path) -> list[dict[str, Any]]:
    """The Delta table's commits written by Sparkpoint (`delta_history` entries), oldest first."""
    return [c for c in delta_history(output) if c["batch"] is not None]


def run_cutover(spark: Any, base: Path, *, pace_s: float = 2.5, first_files: int = 2, margin: int = 3,
                after_n: int = 4, timeout_s: float = 300.0, probe: Callable[[], Any] | None = None,
                green_commits: bool = True, burst: bool = True) -> CutoverRun:
    """Run one cutover (the module docstring) under `base`; blue's log is
    ``base/blue/totals.log``. Green's error, if any, is returned, not raised; a step
    that does not happen within `timeout_s` raises AssertionError with blue's log.
    `probe` (e.g. green's CPU seconds so far) is called at each of `CutoverRun.marks`.
    `green_commits` False (with `after_n` 0: no input past N): green is stopped once it
    claimed the job and took its adoption checkpoint at N, before it committed anything.
    `burst` True: at the agreement, the input of every batch through N + `after_n` is there
    at once (blue runs through N at its trigger's pace while green follows); False: the
    input keeps its pace through batch N (a steady stream: green keeps up), and only the
    input past N is there at once when N's is written. Either way green has input for N + 1
    the moment it takes over, so the gap is the handover's, not the input's."""
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob

    root, inputs, output = base / "blue" / "checkpoints", base / "blue" / "input", base / "blue" / "output"
    log = base / "blue" / f"{JOB}.log"
    inputs.mkdir(parents=True, exist_ok=True)

    def blue_log() -> str:
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-60:])

    feeder = Feeder(inputs, pace_s)
    feeder.start(first_files)
    env = submit_env()
    cmd = spark_submit_command(JOB_SCRIPT, blue_conf(root), ["--input", str(inputs), "--output", str(output),
                                                             "--sink", "delta"], env=env)
    proc = start_spark_submit(cmd, env=env, log=log)
    green_thread: threading.Thread | None = None
    outcome: dict[str, Any] = {}
    marks: dict[str, tuple[float, Any]] = {}

    def mark(name: str) -> None:
        marks[name] = (time.monotonic(), probe() if probe is not None else None)
    try:
        catalog = Catalog.open(str(root), JOB)
        wait_for("blue's checkpoint of batch 1",
                 lambda: (((catalog.read_status() or {}).get("last_batch") or -1) >= 1
                          and catalog.latest() is not None),
                 timeout_s, blue_log, proc=proc)
        status = catalog.read_status() or {}
        blue_generation = int(status["generation"])
        latest = catalog.latest()
        assert latest is not None
        warmup_uri, k = catalog.checkpoint_uri(latest.id), latest.batch_id
        cid = new_cutover_id()
        store = CutoverStore(catalog)
        plan = store.plan(CutoverPlan(cid, JOB, blue_generation, warmup_uri, k, f"{JOB}-shadow",
                                      str(base / "shadow"), requested_by="test_cutover_e2e"))

        green = SparkpointJob.get_or_create(conf={
            "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.trigger": f"processingTime:{TRIGGER_S:g}s",
            "spark.sparkpoint.control.pollInterval": "0.3s",
            "spark.sparkpoint.shadow.mode": "discard", "spark.sparkpoint.shadow.dir": plan.green_root,
            "spark.sparkpoint.shadow.from": warmup_uri, "spark.sparkpoint.shadow.pollInterval": "0.2s",
            "spark.sparkpoint.cutover": cid,
        }, argv=["--input", str(inputs), "--output", str(output), "--sink", "delta"])
        doubled = spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
            str(inputs)).withColumn("amount", F.col("amount") * 2)
        query = doubled.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
        sink = job_module().sink_of(green)

        def body() -> None:
            try:
                outcome["result"] = green.run(query, sink=sink, output_mode="update")
            except BaseException as exc:  # noqa: BLE001 - returned to the caller
                outcome["error"] = exc

        green_thread = threading.Thread(target=body, name="green", daemon=True)
        mark("green_start")
        green_thread.start()

        def green_log() -> str:
            return f"green: {outcome.get('error')!r}\nblue:\n{blue_log()}"

        seen: list[ProgressSighting | None] = [None]  # green's record as these looks saw it

        def close_enough() -> int | None:
            if "error" in outcome:
                raise AssertionError(f"green failed during its warm-up: {outcome['error']!r}")
            progress = store.read(cid).progress
            last = (catalog.read_status() or {}).get("last_batch")
            now = time.time()
            seen[0] = sighting_of(progress, seen[0], now)
            if progress is None or last is None:
                return None
            return int(last) if progress.within(int(last), plan.lag_batches, seen=seen[0], now=now,
                                                max_age=60.0) else None

        last = wait_for("green within the plan's lag of blue", close_enough, timeout_s, green_log, proc=proc)
        assert last is not None
        n = last + margin
        stop = stop_after_batch(catalog, n, timeout_s=timeout_s, poll_s=0.3, max_heartbeat_age=60.0,
                                requested_by="test_cutover_e2e", wait=False, generation=blue_generation,
                                cutover_id=cid)
        store.agree(cid, n, stop.request_id)
        if not burst:
            wait_for(f"input file {n} at its pace", lambda: len(feeder.files) > n, timeout_s, green_log,
                     proc=proc)
        feeder.rush(n + after_n)  # the input past N is there when blue stops: the gap is the handover's
        try:
            blue_exit = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"blue did not stop after batch {n}:\n{green_log()}") from None
        mark("blue_exit")
        gen_green = blue_generation + 1

        def green_committed(batch: int) -> bool:
            if "error" in outcome:
                raise AssertionError(f"green failed: {outcome['error']!r}")
            return any(c["batch"] == batch and c["generation"] == gen_green
                       for c in sparkpoint_commits(output))

        if blue_exit == 0 and not green_commits:
            def adopted() -> bool:
                if "error" in outcome:
                    raise AssertionError(f"green failed: {outcome['error']!r}")
                return store.read(cid).claimed is not None and any(
                    m.generation == gen_green and m.batch_id == n for m in catalog.checkpoints())

            wait_for(f"green's claim and adoption checkpoint at batch {n}", adopted, timeout_s, green_log)
            channel = ControlChannel(catalog)
            request = channel.submit("stop", generation=gen_green, timeout_s=timeout_s)
            channel.wait(request.id, timeout_s=timeout_s, poll_s=0.3)
        elif blue_exit == 0:
            wait_for(f"green's commit of batch {n + 1}", lambda: green_committed(n + 1), timeout_s, green_log)
            # green's run ends the cutover itself after that commit (`runtime.cutover.record_first_commit`)
            wait_for("green's done: committed", lambda: store.read(cid).done is not None, timeout_s,
                     green_log)
            last_file = len(feeder.files) - 1
            wait_for(f"green's commit of batch {last_file}", lambda: green_committed(last_file), timeout_s,
                     green_log)
            channel = ControlChannel(catalog)
            request = channel.submit("stop", generation=gen_green, timeout_s=timeout_s)
            channel.wait(request.id, timeout_s=timeout_s, poll_s=0.3)
        green_thread.join(timeout_s)
        mark("green_end")
        return CutoverRun(base, list(feeder.files), cid, k, n, blue_generation, blue_exit, stop.request_id,
                          outcome.get("result"), outcome.get("error"), sparkpoint_commits(output), log, marks)
    finally:
        feeder.rush(-1)
        if proc.poll() is None:  # a failed wait: end blue's spark-submit and its JVM (its own group)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
        if green_thread is not None and green_thread.is_alive():  # a failed wait: stop green too
            _stop_green(root, base / "shadow", green_thread)


def _stop_green(root: Path, shadow_root: Path, thread: threading.Thread) -> None:
    """Ask green's live run, the shadow's or the adopted one's, to stop, and wait a
    while (a run left going would fail on the session's end, after the test)."""
    for catalog in (Catalog.open(str(root), JOB), Catalog.open(str(shadow_root), f"{JOB}-shadow")):
        status = read_job_status(catalog)
        if status is not None and status.is_alive(60.0):
            ControlChannel(catalog).submit("stop", generation=status.generation, timeout_s=60.0)
    thread.join(60)
