"""The chaos scenarios: what the processes of one trial do, in order.

==============  ==========================================================================
``crash``       each fault in its own driver (or commit step), one after the other, each
                run restarting where the previous one died; then a clean retry. Two
                faults ``record``/``confirmed`` then ``recovery`` of the same batch are
                the double fault *a kill during recovery*.
``rewind``      (Delta) a clean run; a run restoring the oldest retained checkpoint with
                ``restore.sinkAhead=rewind``, killed at ``rewind`` (before it completes a
                checkpoint); the retry with ``restore=latest`` (issue #15, hole 2).
``retention``   a clean run (``numRetained=3``); two more input files; a run with
                ``numRetained=1`` killed halfway through the retention deletes of its
                first checkpoint; the retry.
``stop-abort``  stop-with-savepoint while batch N is recorded but not confirmed (the
                driver held at pause point ``recorded``): the stop aborts N, killed at
                ``abort``; the retry.
``rollback``    (external) blue runs 2 batches and stops with a savepoint; green
                restores it and runs 2 more; the rollback (``sparkpoint commit
                --abort-generation``) is killed halfway at ``abort`` and retried; blue,
                restored from the savepoint, is killed at ``stage`` before its first
                checkpoint; its retry (``restore=latest``, as an Airflow retry) finishes.
``cutover``     a zero-downtime cutover (blue, green warming up beside it, the agreement
                at N, blue's stop, green's claim and first commit) killed at one of its
                fault points, recovered as the protocol says (green's retry, or the
                call-off and blue's restart), drained: `tests.chaos.cutover`.
==============  ==========================================================================
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.faults import ENV, ENV_ONCE
from airflow_sparkpoint.runtime import livedir
from tests.chaos.cases import JOB, job_script, split_key
from tests.chaos.cutover import cutover
from tests.chaos.harness import (
    BATCHES,
    SPARKPOINT,
    Fault,
    Run,
    Trial,
    TrialResult,
    compare,
    evidence,
    run_process,
    spark_submit,
    write_inputs,
)
from tests.support.s3_servers import S3Context

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints import Catalog

#: fault points of the stop-with-savepoint path: a processingTime job, stopped when drained
STOP_POINTS = ("savepoint", "stopped")
#: fault points inside a checkpoint: the batch after is held (at pause point ``stage``)
#: until that checkpoint exists (`pacer`). The coordinator checkpoints the newest
#: confirmed batch and skips ones queued up behind a slow checkpoint: unpaced, a
#: checkpoint of the fault's batch may never be taken
PACED_POINTS = ("copy", "metadata", "checkpointed", "retention")
#: how long pacing holds a driver at the batch after for that checkpoint before it gives up
PACE_TIMEOUT_S = 300.0
#: the Spark conf keys of the runtime's pause points (`airflow_sparkpoint.faults`)
PAUSE_AT, PAUSE_DIR = "spark.sparkpoint.test.pauseAt", "spark.sparkpoint.test.pauseDir"
#: how long the stop-abort scenario holds the batch after the driver took the stop request
STOP_SETTLE_S = 5.0
SCENARIOS = ("crash", "rewind", "retention", "stop-abort", "rollback", "cutover")


class TrialRun:
    """The state of one trial while its processes run (see `tests.chaos.harness`)."""

    def __init__(self, trial: Trial, base: Path, s3: Mapping[str, S3Context]) -> None:
        case_cls, server = split_key(trial.case)
        self.trial = trial
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.case = case_cls(base, s3[server] if server else None)
        self.result = TrialResult(trial)
        self.expected = write_inputs(base / "input", files=self.initial_files())
        self.last_batch = len(self.expected) // 3 - 1
        self.catalog = self.case.catalog(JOB)
        self.conf = {
            "spark.sparkpoint.restore": "latest",
            "spark.sparkpoint.commit.mode": trial.mode,
            "spark.sparkpoint.control.pollInterval": "300ms",
            **self.case.conf(JOB),
        }
        if trial.staging == "executors":
            self.conf["spark.sparkpoint.delta.driverStagingMaxBytes"] = "0"
        self.armed = 0

    def initial_files(self) -> int:
        return 2 if self.trial.scenario in ("rollback", "cutover") else BATCHES

    def more_input(self, files: int) -> None:
        start = self.last_batch + 1
        self.expected += write_inputs(self.base / "input", files=files, start=start)
        self.last_batch += files

    # ------------------------------------------------------------------ processes

    def _arm(self, fault: Fault | None) -> tuple[dict[str, str], Path | None]:
        if fault is None:
            return {}, None
        self.armed += 1
        marker = self.base / f"fault-{self.armed}-{fault.point}"
        return {ENV: fault.spec, ENV_ONCE: str(marker)}, marker

    def _witness(self, fault: Fault, run: Run, marker: Path) -> bool:
        firing = evidence(fault, run, marker)
        self.result.firings.append(firing)
        if firing.fired and fault.point == "promoting":
            self._check_partial(fault)
        return firing.fired

    def _check_partial(self, fault: Fault) -> None:
        """A kill at promoting must leave the batch half promoted (the retry repairs it)."""
        records = [r for r in self.catalog.transactions() if r.batch_id == fault.batch]
        if not records:
            self.result.problems.append(f"after the kill at {fault}: no transaction record "
                                        f"of batch {fault.batch}")
            return
        problem = self.case.partial_promotion(records[-1])
        if problem:
            self.result.problems.append(f"after the kill at {fault}: {problem}")
        else:
            self.result.notes.append(f"{fault}: {self.case.describe_promotion(records[-1])}")

    def job(self, name: str, fault: Fault | None = None, *, conf: Mapping[str, str] | None = None,
            stop_when_drained: bool = False, commit: bool = True, pace_after: int | None = None,
            on_poll: Callable[[], None] | None = None) -> Run:
        """One driver (armed with `fault` when it is a driver fault; paced after batch
        `pace_after`, by default after a `PACED_POINTS` fault's batch: `pacer`); then, in
        external mode and unless `commit` is False, the commit step (armed with a
        commit-step fault).

        Raises ValueError if pacing and the `conf` of the caller both arm pause point
        ``stage`` (`arm_stage_pause`)."""
        job_fault = fault if fault is not None and fault.where == "job" else None
        env, marker = self._arm(job_fault)
        args = ["--input", str(self.base / "input"), "--output", self.case.output()]
        if pace_after is None and job_fault is not None and job_fault.point in PACED_POINTS \
                and job_fault.batch is not None and job_fault.batch < self.last_batch:
            pace_after = job_fault.batch
        full_conf = {**self.conf, **(conf or {})}
        poll = on_poll
        if pace_after is not None:
            pause_dir = arm_stage_pause(full_conf, pace_after + 1, self.base / f"pause-{name}")
            poll = _chain(poll, pacer(self.catalog, pace_after, full_conf["spark.sparkpoint.commit.mode"],
                                      pause_dir, self.result.notes))
        if stop_when_drained:
            full_conf["spark.sparkpoint.trigger"] = "processingTime:500ms"
            poll = _chain(poll, self._stop_when_drained())
        run = spark_submit(job_script(self.case), conf=full_conf, args=args, log=self.base / f"{name}.log",
                           env=env, on_poll=poll)
        self.result.logs.append(run.log)
        if run.timed_out:
            self.result.problems.append(f"{name} timed out after {run.seconds:.0f} s")
        if job_fault is not None and marker is not None:
            self._witness(job_fault, run, marker)
        if self.trial.mode == "external" and commit:
            commit_fault = fault if fault is not None and fault.where == "commit" else None
            self.commit_step(f"commit-{name}", commit_fault)
        return run

    def commit_step(self, name: str, fault: Fault | None = None) -> None:
        """The external commit step: its own process when armed (so the fault can kill
        it), otherwise in this process (the hook is only armed in child processes)."""
        from airflow_sparkpoint.services.commit import commit_pending

        if fault is None:
            try:
                commit_pending(self.catalog, storage_options=self.case.storage_options())
            except Exception as exc:  # noqa: BLE001 - a finding, reported with the trial
                self.result.problems.append(f"{name} failed: {type(exc).__name__}: {exc}")
            return
        run = self.cli(name, ["commit"], fault)
        if run.returncode not in (0, -signal.SIGKILL) or run.timed_out:
            self.result.problems.append(f"{name} failed (exit {run.returncode}):\n{run.tail()}")

    def cli(self, name: str, command: Sequence[str], fault: Fault | None = None) -> Run:
        """``sparkpoint <command> --dir --job`` of this trial's job as its own process."""
        env, marker = self._arm(fault)
        cmd = [SPARKPOINT, *command, "--dir", self.case.checkpoint_root(), "--job", JOB]
        options = self.case.storage_options()
        if options.get("endpoint_url"):
            cmd += ["--s3-endpoint", str(options["endpoint_url"]), "--s3-region", str(options["region_name"])]
        run = run_process(cmd, log=self.base / f"{name}.log", env=env)
        self.result.logs.append(run.log)
        if fault is not None and marker is not None:
            self._witness(fault, run, marker)
        return run

    def final(self, name: str, **kwargs: Any) -> Run:
        """The clean run that must end the trial well."""
        run = self.job(name, **kwargs)
        status = (run.result or {}).get("status")
        if run.returncode != 0 or status not in ("finished", "stopped"):
            self.result.problems.append(f"{name} failed (exit {run.returncode}):\n{run.tail()}")
        return run

    def clean(self, name: str, **kwargs: Any) -> Run | None:
        """A clean run that the scenario needs to succeed; None (and a problem) if not."""
        run = self.job(name, **kwargs)
        if run.returncode != 0 or not run.result:
            self.result.problems.append(f"{name} (no fault armed) failed (exit "
                                        f"{run.returncode}):\n{run.tail()}")
            return None
        return run

    def _stop_when_drained(self) -> Callable[[], None]:
        """An `on_poll` sending one stop (stop-with-savepoint) request once a new
        generation has confirmed the last batch."""
        from airflow_sparkpoint.checkpoints.control import ControlChannel

        before = self.catalog.current_generation()
        sent: list[bool] = []

        def poll() -> None:
            if sent:
                return
            status = self.catalog.read_status() or {}
            if (int(status.get("generation") or 0) > before and status.get("state") == "running"
                    and _drained(status, self.last_batch)):
                ControlChannel(self.catalog).submit("stop", generation=int(status["generation"]),
                                                    timeout_s=300, requested_by="chaos")
                sent.append(True)

        return poll

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        result = self.result
        try:
            result.verdict = compare(self.case, self.expected, self.case.rows())
            leftovers = self.case.leftovers(JOB)
            if leftovers:
                result.problems.append(f"orphan staged data: {leftovers[:5]}")
            records = self.catalog.transactions()
            if records:
                result.problems.append(f"leftover transaction records: {[r.txn_id for r in records]}")
            if self.catalog.latest() is None:
                result.problems.append("no valid checkpoint after the retry")
        except Exception as exc:  # noqa: BLE001 - reported with the trial
            result.problems.append(f"checking the output failed: {type(exc).__name__}: {exc}")


def _drained(status: Mapping[str, Any], last_input: int) -> bool:
    """Whether the run `status` describes has confirmed the batch of the last input file:
    batch `last_input`, or an earlier one that covers it because Spark folded source-log
    batches after a kill (``offsets/N`` = ``{"logOffset": last_input}``; no batch
    `last_input` will ever come, and waiting for it would only time out)."""
    last = status.get("last_batch")
    if not isinstance(last, int):
        return False
    if last >= last_input:
        return True
    live = status.get("live_dir")
    if not isinstance(live, str) or not os.path.isfile(os.path.join(live, "commits", str(last))):
        return False
    ends = livedir.source_log_ends(live, last)
    return bool(ends) and all(end >= last_input for end in ends.values())


def pacer(catalog: Catalog, after: int, commit_mode: str, pause_dir: Path,
          notes: list[str]) -> Callable[[], None]:
    """An `on_poll` releasing the driver held at pause point ``stage`` of batch `after` + 1
    (in `pause_dir`, see `arm_stage_pause`) once `_checkpointed` holds for `after`; or,
    with a line in `notes`, `PACE_TIMEOUT_S` after the driver got there without it (the
    fault then likely does not fire, and the trial says so). The catalog is read only
    while the driver is held (a driver killed before batch `after` + 1 never is)."""
    reached_at: float | None = None
    released = False

    def poll() -> None:
        nonlocal reached_at, released
        if released:
            return
        if reached_at is None:
            if not (pause_dir / "stage.reached").exists():
                return
            reached_at = time.monotonic()
        ready = _checkpointed(catalog, after, commit_mode)
        if not ready and time.monotonic() - reached_at <= PACE_TIMEOUT_S:
            return
        if not ready:
            notes.append(f"pacing: no checkpoint of batch {after} within {PACE_TIMEOUT_S:.0f} s of the "
                         f"driver reaching stage:{after + 1}; released it anyway")
        (pause_dir / "stage.release").touch()
        released = True

    return poll


def _checkpointed(catalog: Catalog, batch: int, commit_mode: str) -> bool:
    """Whether a checkpoint of `batch` or later is complete and, in ``checkpoint`` commit
    mode, no transaction record of a batch up to `batch` is left (all committed)."""
    latest = catalog.latest()
    if latest is None or latest.batch_id < batch:
        return False
    return commit_mode != "checkpoint" or all(r.batch_id > batch for r in catalog.transactions())


def arm_stage_pause(conf: dict[str, str], batch: int, default_dir: Path) -> Path:
    """Arm pause point ``stage:<batch>`` in `conf` beside the pause points the caller
    armed there (their directory, else `default_dir`); return the pause directory.

    Raises ValueError if the caller armed ``stage`` itself (a point pauses once) or armed
    points without a directory."""
    armed = conf.get(PAUSE_AT, "").strip()
    if "stage" in (item.partition(":")[0].strip() for item in armed.split(",")):
        raise ValueError(f"pacing arms pause point stage:{batch}, but the run arms {PAUSE_AT}={armed!r}")
    if armed and not conf.get(PAUSE_DIR):
        raise ValueError(f"{PAUSE_AT}={armed!r} without {PAUSE_DIR}")
    conf[PAUSE_AT] = ",".join(filter(None, (armed, f"stage:{batch}")))
    conf.setdefault(PAUSE_DIR, str(default_dir))
    return Path(conf[PAUSE_DIR])


def _chain(*polls: Callable[[], None] | None) -> Callable[[], None]:
    def poll() -> None:
        for one in polls:
            if one is not None:
                one()

    return poll


# ---------------------------------------------------------------------------- scenarios


def crash(tr: TrialRun) -> None:
    stop = any(f.point in STOP_POINTS for f in tr.trial.faults)
    faults = tr.trial.faults
    for number, fault in enumerate(faults, start=1):
        pace = None
        if number < len(faults) and faults[number].point == "recovery" and fault.batch:
            # The recovery then settles exactly this batch's record (every earlier batch
            # is checkpointed, and committed or left to the commit step), so the kill
            # halfway through it is at this batch.
            pace = fault.batch - 1
        tr.job(f"try{number}", fault, stop_when_drained=stop, pace_after=pace)
    tr.final(f"try{len(tr.trial.faults) + 1}", stop_when_drained=stop)


def rewind(tr: TrialRun) -> None:
    if tr.clean("try1") is None:
        return
    retained = tr.catalog.checkpoints()  # newest first
    target = retained[-1]
    if len(retained) < 2 or target.batch_id >= tr.last_batch:
        tr.result.problems.append(f"no older checkpoint to rewind to: {[m.batch_id for m in retained]}")
        return
    uri = tr.catalog.checkpoint_uri(target.id)
    tr.job("try2", Fault("rewind", target.batch_id),
           conf={"spark.sparkpoint.restore": uri, "spark.sparkpoint.restore.sinkAhead": "rewind"})
    tr.final("try3")


def retention(tr: TrialRun) -> None:
    if tr.clean("try1", conf={"spark.sparkpoint.checkpoint.numRetained": "3"}) is None:
        return
    first_new = tr.last_batch + 1
    tr.more_input(2)
    small = {"spark.sparkpoint.checkpoint.numRetained": "1"}
    tr.job("try2", Fault("retention", first_new), conf=small)
    tr.final("try3", conf=small)


def stop_abort(tr: TrialRun) -> None:
    """See the module docstring: the stop is requested while the driver is held right
    after recording batch N, and the hold is released once the stop was taken."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    batch = tr.last_batch
    pause_dir = tr.base / "pause"
    channel = ControlChannel(tr.catalog)
    state: dict[str, Any] = {}

    log = tr.base / "try1.log"

    def poll() -> None:
        if "released" in state or not (pause_dir / "recorded.reached").exists():
            return
        if "request" not in state:
            # the held driver's own generation (it claimed before it staged anything)
            state["request"] = channel.submit("stop", generation=tr.catalog.current_generation(),
                                              timeout_s=300, requested_by="chaos").id
        elif "taken" not in state:
            # The driver logs the request right before it stops the query (which interrupts
            # the held batch); released a little later, the batch is never confirmed.
            if f"control request {state['request']}: stop" in log.read_text(errors="replace"):
                state["taken"] = time.monotonic()
        elif time.monotonic() - state["taken"] > STOP_SETTLE_S:
            (pause_dir / "recorded.release").touch()
            state["released"] = True

    tr.job("try1", Fault("abort", batch), on_poll=poll,
           conf={"spark.sparkpoint.trigger": "processingTime:500ms",
                 "spark.sparkpoint.test.pauseAt": f"recorded:{batch}",
                 "spark.sparkpoint.test.pauseDir": str(pause_dir)})
    if "released" not in state:
        tr.result.problems.append(f"the driver never reached pause point recorded:{batch}")
    tr.final("try2", stop_when_drained=True)


def rollback(tr: TrialRun) -> None:
    blue = tr.clean("blue", stop_when_drained=True)
    savepoint = (blue.result or {}).get("savepoint") if blue else None
    if not savepoint:
        tr.result.problems.append("blue stopped without a savepoint")
        return
    green_first = tr.last_batch + 1
    tr.more_input(2)
    green = tr.clean("green", conf={"spark.sparkpoint.restore": savepoint}, commit=False,
                     pace_after=green_first)
    if green is None:
        return
    generation = int((green.result or {})["generation"])
    abort = Fault("abort", green_first, where="rollback")
    tr.cli("rollback1", ["commit", "--abort-generation", str(generation)], abort)
    again = tr.cli("rollback2", ["commit", "--abort-generation", str(generation)])
    if again.returncode != 0:
        tr.result.problems.append(f"the retried rollback failed (exit {again.returncode}):\n{again.tail()}")
    latest = tr.catalog.latest()
    if latest is not None and latest.generation == generation:
        tr.result.problems.append(
            f"after the rollback, restore=latest would pick checkpoint {latest.id} (batch {latest.batch_id}) "
            f"of the rolled-back generation {generation}")
    tr.job("blue-restored", Fault("stage", green_first), conf={"spark.sparkpoint.restore": savepoint})
    tr.final("blue-retry")


RUNNERS: dict[str, Callable[[TrialRun], None]] = {
    "crash": crash, "rewind": rewind, "retention": retention, "stop-abort": stop_abort, "rollback": rollback,
    "cutover": cutover,
}


def run_trial(trial: Trial, base: Path, s3: Mapping[str, S3Context]) -> TrialResult:
    """Run one trial in `base` (a fresh directory) and check everything."""
    started = time.monotonic()
    tr = TrialRun(trial, base, s3)
    try:
        RUNNERS[trial.scenario](tr)
        tr.check()
    except Exception as exc:  # noqa: BLE001 - reported with the trial
        tr.result.problems.append(f"the trial broke: {type(exc).__name__}: {exc}")
    tr.result.seconds = time.monotonic() - started
    return tr.result


def spark_folded(base: Path) -> list[str]:
    """The ``offsets/N`` entries of the trial's live locations whose file-source offset is
    not N: Spark folded source-log batches into one micro-batch (runtime.livedir.source_log_ends)."""
    folded = []
    for offsets in sorted(base.rglob("offsets")):
        if "live" not in offsets.parts or not offsets.is_dir():
            continue
        for entry in sorted(offsets.iterdir()):
            if not entry.name.isdigit():
                continue
            ends = livedir.source_log_ends(str(offsets.parent), int(entry.name))
            if any(end != int(entry.name) for end in ends.values()):
                folded.append(f"{entry.relative_to(base)} = {ends}")
    return folded


def run_trials(trials: Sequence[Trial], base: Path, s3: Mapping[str, S3Context], workers: int = 1,
               progress: Callable[[TrialResult], None] | None = None) -> list[TrialResult]:
    """Run `trials` on `workers` threads (each trial is its own processes)."""
    lock = threading.Lock()

    def one(trial: Trial) -> TrialResult:
        name = trial.case.replace("@", "-")
        path = base / f"t{trial.index:03d}-{name}"
        result = run_trial(trial, path, s3)
        folded = spark_folded(path) if not result.ok else []
        if folded:
            # The plan keeps faults clear of folds (`plan.fold_hazards`); one that happened
            # anyway is named beside the failure.
            result.notes.append(f"Spark folded source-log batches: {', '.join(folded[:3])}")
        if progress is not None:
            with lock:
                progress(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, trials))
