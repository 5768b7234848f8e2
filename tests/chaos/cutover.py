"""The ``cutover`` chaos scenario: a zero-downtime blue-green cutover (issue 49) with real
drivers, killed at one of its fault points, recovered as docs/PROTOCOL.md ("Zero-downtime
cutover") says, drained, and checked like every trial (exact output against the input,
no staged leftovers, no transaction record left).

The trial, with the test as the orchestrator (`services.cutover`, `checkpoints.cutover`):

1. blue (the case's chaos job, ``processingTime``) runs on input files 0 and 1; once its
   checkpoint of batch 1 (K) exists, the cutover is planned with K as green's warm-up start;
2. green (the same job script with ``spark.sparkpoint.shadow.*`` and
   ``spark.sparkpoint.cutover``) warms up in its shadow identity; input file 2 arrives and
   both run it (green replays blue's batch 2);
3. the agreement at N = 3 (`AGREED`): blue's ``stop_after`` request, then the ``agreed``
   record, in their own process (``cutover_agree.py``); input files 3..5 arrive;
4. blue commits through N and stops; green replays through N, claims blue's generation + 1
   and commits 4 and 5 into blue's sink; it is stopped once drained.

The fault (one per trial, in the process `WHERE` names) and its recovery:

=========================  =======================================================
``cutover_warmup:2``        green dies during its warm-up; its retry (same settings,
                            as an Airflow retry) warms up from K again and takes over
``cutover_agreement:3``     the orchestrator dies after filing blue's request, before
                            the agreement: its retry calls the cutover off, which
                            withdraws the request unless blue took it; blue stops
                            after N (taken) or runs on and is stopped, green fails,
                            blue is restarted (``restore=latest``: its own lineage)
``stop_after:3``,           blue dies in its stop: the orchestrator calls the cutover
``stopped_after:3``         off (green fails), blue is restarted (``restore=latest``)
``cutover_ready:3``         green dies at N, blue stopped, before its claim: its retry
                            replays from K to N again and takes over
``cutover_claimed:3``       green dies right after claiming blue's generation + 1: its
                            retry is refused (the generation is taken), the cutover is
                            called off and blue restarted (blue's lineage at N)
``cutover_first_commit:4``  green dies right after its first commit (N + 1) into blue's
                            sink: the job is green's; the retry of green's task, with
                            the same shadow settings, restarts it (``restore=latest``)
``abort:4`` (rollback)      the rollback after the cutover: green (``commit.mode=
                            external``: its batches after N wait for the commit step)
                            took over and is stopped; ``sparkpoint commit
                            --abort-generation`` of green's generation dies halfway,
                            its retry completes, the cutover ends ``rolled_back``, and
                            blue restarts where the rollback returned the lineage
                            (``restore=latest``: blue's final savepoint of N, green
                            having committed nothing past N)
=========================  =======================================================

Each trial also checks the path its recovery took: green took the job over (claimed)
or the cutover was called off, as above, and the cutover is closed at the end.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverState, CutoverStore, new_cutover_id
from airflow_sparkpoint.exceptions import RestoreError
from tests.chaos.cases import JOB
from tests.chaos.harness import HERE, Fault, Run, run_process

if TYPE_CHECKING:
    from tests.chaos.scenarios import TrialRun

__all__ = ["AGREED", "CASES", "POINTS", "ROLLBACK", "WARMUP", "WHERE", "cutover", "fault_for"]

#: blue's checkpoint green warms up from is of this batch (input files 0 and 1 first)
WARMUP_FROM = 1
#: the batch green replays during its warm-up, before the agreement
WARMUP = WARMUP_FROM + 1
#: the agreed batch N: blue's last, green's first is N + 1
AGREED = WARMUP + 1
#: input files after the agreement: N and two batches of green's
AFTER = 3
#: the cutover's fault points and the batch each is armed at
POINTS: dict[str, int] = {
    "cutover_warmup": WARMUP, "cutover_agreement": AGREED, "stop_after": AGREED, "stopped_after": AGREED,
    "cutover_ready": AGREED, "cutover_claimed": AGREED, "cutover_first_commit": AGREED + 1,
}
#: which process a point's fault is armed in
WHERE: dict[str, str] = {"cutover_agreement": "agreement", "stop_after": "blue", "stopped_after": "blue"}
#: the points after which green takes the job over (the others end in a call-off)
TAKEN_OVER = ("cutover_warmup", "cutover_ready", "cutover_first_commit", "abort")
#: the rollback after a cutover: its fault (the abort of green's generation, halfway)
ROLLBACK = Fault("abort", AGREED + 1, "rollback")
#: the cases a cutover runs on (issue 49: Delta append and merge, the S3 sink); blue's
#: stop_after needs commit.mode=checkpoint, so only that mode
CASES = ("delta-append", "delta-merge", "s3@moto", "s3@seaweedfs")
#: how long one step of the orchestrator waits
STEP_TIMEOUT_S = 400.0


def fault_for(point: str) -> Fault:
    """The trial's fault at cutover point `point`: blue's and green's are driver faults
    (``where`` ``job``), the agreement's is armed in the agreement process."""
    return Fault(point, POINTS[point], "agreement" if WHERE.get(point) == "agreement" else "job")


class _Aborted(Exception):
    """The trial gave up: a background driver is killed (its run_process poll raises)."""


class _Driver:
    """A driver's runs in a thread of their own (blue, or green and its retries)."""

    def __init__(self, name: str, body: Callable[[], Run | None], tr: TrialRun) -> None:
        self.name = name
        self.run: Run | None = None
        self._body = body
        self._tr = tr
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        try:
            self.run = self._body()
        except _Aborted:
            pass
        except Exception as exc:  # noqa: BLE001 - reported with the trial
            self._tr.result.problems.append(f"{self.name} broke: {type(exc).__name__}: {exc}")

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def cutover(tr: TrialRun) -> None:
    """The scenario (module docstring)."""
    (fault,) = tr.trial.faults
    abort = threading.Event()
    drivers: list[_Driver] = []

    def kill_switch() -> None:
        if abort.is_set():
            raise _Aborted()

    try:
        _cutover(tr, fault, kill_switch, drivers)
    finally:
        abort.set()  # a driver still running after a failed step is killed by its own poll
        for driver in drivers:
            driver.join(60)


def _wait(what: str, predicate: Callable[[], Any], *drivers: _Driver) -> Any:
    """Poll `predicate` until truthy (its value); AssertionError after `STEP_TIMEOUT_S` or
    once one of `drivers` ended (it can no longer happen)."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        ended = [d.name for d in drivers if not d.alive]
        if ended:
            value = predicate()
            if value:
                return value
            raise AssertionError(f"{', '.join(ended)} ended before {what}")
        time.sleep(0.25)
    raise AssertionError(f"no {what} after {STEP_TIMEOUT_S:.0f} s")


def _cutover(tr: TrialRun, fault: Fault, kill_switch: Callable[[], None], drivers: list[_Driver]) -> None:
    catalog = tr.catalog
    store = CutoverStore(catalog)
    blue_conf = {"spark.sparkpoint.trigger": "processingTime:500ms",
                 # K stays (green's retry warms up from it again)
                 "spark.sparkpoint.checkpoint.numRetained": "100"}
    blue_fault = fault if WHERE.get(fault.point) == "blue" else None
    blue = _Driver("blue", lambda: tr.job("blue", blue_fault, conf=blue_conf, on_poll=kill_switch), tr)
    drivers.append(blue)
    blue.start()

    def status() -> dict[str, Any]:
        return catalog.read_status() or {}

    latest = _wait(f"blue's checkpoint of batch {WARMUP_FROM}",
                   lambda: (m := catalog.latest()) is not None and m.batch_id >= WARMUP_FROM and m, blue)
    generation = int(status()["generation"])
    warmup_uri = catalog.checkpoint_uri(latest.id)
    cid = new_cutover_id()
    shadow_root = str(tr.base / "shadow")
    store.plan(CutoverPlan(cid, JOB, generation, warmup_uri, latest.batch_id, f"{JOB}-shadow", shadow_root,
                           requested_by="chaos"))
    green_conf = {"spark.sparkpoint.shadow.mode": "discard", "spark.sparkpoint.shadow.dir": shadow_root,
                  "spark.sparkpoint.shadow.from": warmup_uri, "spark.sparkpoint.shadow.pollInterval": "200ms",
                  "spark.sparkpoint.cutover": cid}
    if fault.where == "rollback":  # green stages only: the rollback can still discard its batches
        green_conf["spark.sparkpoint.commit.mode"] = "external"
    green_fault = fault if fault.where == "job" and fault.point not in WHERE else None

    def green_runs() -> Run | None:
        run = tr.job("green", green_fault, conf=green_conf, stop_when_drained=True, on_poll=kill_switch)
        if green_fault is not None and run.returncode == -signal.SIGKILL:
            # the Airflow retry of green's task: the same settings (after green's claim, a
            # restart of the job with restore=latest: `runtime.cutover.taken_over`)
            run = tr.job("green-retry", None, conf=green_conf, stop_when_drained=True, on_poll=kill_switch)
        return run

    green = _Driver("green", green_runs, tr)
    drivers.append(green)
    green.start()

    tr.more_input(1)  # batch WARMUP: blue runs it, green replays it in its warm-up
    _wait(f"green's warm-up replay of batch {WARMUP}",
          lambda: _replayed(store.read(cid)) >= WARMUP and int(status().get("last_batch") or -1) >= WARMUP,
          blue, green)

    agreed = _agree(tr, cid, generation, fault if fault.where == "agreement" else None)
    if not agreed:  # the orchestrator died between blue's request and the agreement: its retry calls off
        _call_off(tr, store, cid, "the orchestrator died before the agreement")
    tr.more_input(AFTER)
    if not agreed:
        _stop_blue_unless_it_took_the_request(tr, store, cid, generation, blue)
    if not blue.join(STEP_TIMEOUT_S):
        raise AssertionError(f"blue did not stop after batch {AGREED}")
    blue_run = blue.run
    if blue_fault is not None:
        # blue died in its stop: the request is taken, never completed; the orchestrator calls off
        _call_off(tr, store, cid, f"blue died in its stop after batch {AGREED}")
    elif blue_run is not None and blue_run.returncode != 0:
        tr.result.problems.append(f"blue (no fault armed) exited {blue_run.returncode}:\n{blue_run.tail()}")
    if not green.join(STEP_TIMEOUT_S + 120):
        raise AssertionError("green did not end")
    state = store.read(cid)
    if state.claimed is None and state.done is None:  # green failed before its claim: call off
        _call_off(tr, store, cid, "green failed before its claim")
        state = store.read(cid)
    taken = state.claimed is not None
    if taken != (fault.point in TAKEN_OVER):
        tr.result.problems.append(
            f"after {fault}, expected " + ("green to take the job over" if fault.point in TAKEN_OVER else
                                           "the cutover called off") + f"; the cutover is {state.step}")
    if taken and fault.where == "rollback":
        assert state.claimed is not None
        _roll_back(tr, store, state, fault)
    elif taken:
        assert state.claimed is not None
        green_run = green.run
        if fault.point == "cutover_first_commit" and (green_run is None or green_run.returncode != 0):
            tr.result.problems.append("green's retry with the cutover's settings, after green took the job "
                                      "over, did not restart the job: "
                                      + ("no run" if green_run is None else green_run.tail()))
        if green_run is None or green_run.returncode != 0:
            # the job is green's: any restart of it (no shadow settings) resumes green's lineage
            tr.final("green-restart", stop_when_drained=True)
        store.end(cid, "committed", step="first_commit", generation=state.claimed.generation, by="chaos")
    else:
        tr.final("blue-restart", stop_when_drained=True)  # restore=latest: blue's own lineage at N
    if store.read(cid).open:
        tr.result.problems.append(f"cutover {cid} is still open at the end")


def _roll_back(tr: TrialRun, store: CutoverStore, state: CutoverState, fault: Fault) -> None:
    """The rollback after the cutover (docs/howto/blue-green.md): green is stopped; abort
    its generation (killed halfway by `fault`, then retried), end the cutover as rolled
    back, restore blue from its final savepoint of N (where the rollback returned the
    lineage: green committed nothing past N)."""
    assert state.claimed is not None
    green = state.claimed.generation
    pending = sorted(r.batch_id for r in tr.catalog.transactions() if r.generation == green)
    if len(pending) < 2:
        tr.result.problems.append(f"green staged {pending} for the rollback to abort; the "
                                  "trial needs 2 or more")
    command = ["commit", "--abort-generation", str(green)]
    tr.cli("rollback1", command, fault)
    again = tr.cli("rollback2", command)
    if again.returncode != 0:
        tr.result.problems.append(f"the retried rollback failed (exit {again.returncode}):\n{again.tail()}")
    end = store.end(state.id, "rolled_back", step="rollback", generation=green, by="chaos")
    try:
        final = ("kept" if tr.catalog.own_snapshot(state.claimed.checkpoint) is not None
                 else "retired by green")
    except RestoreError:
        final = "retired by green"
    tr.result.notes.append(f"cutover {state.id}: {end.outcome} at {end.step}; green aborted {pending}; "
                           f"blue's final checkpoint {state.claimed.checkpoint.rsplit('/', 1)[-1]} {final}")
    # restore=latest: where the rollback returned the lineage, blue's final savepoint S of N (blue's
    # own final checkpoint X at N is the base of green's lineage, but green's retention retires X
    # once green has checkpoints of its own; S stays).
    origin = tr.catalog.origins()[-1]
    if (origin.kind, origin.uri) != ("savepoint", state.claimed.savepoint):
        tr.result.problems.append(f"the rollback returned the lineage to {origin.describe()}, not to blue's "
                                  f"final savepoint {state.claimed.savepoint}")
    tr.final("blue-restored", stop_when_drained=True)


def _replayed(state: CutoverState) -> int:
    progress = state.progress
    return -1 if progress is None or progress.replayed_batch is None else progress.replayed_batch


def _agree(tr: TrialRun, cid: str, generation: int, fault: Fault | None) -> bool:
    """The agreement at `AGREED` in its own process (armed with `fault`); whether it
    completed (False: killed by its fault)."""
    env, marker = tr._arm(fault)
    cmd = [sys.executable, str(HERE / "cutover_agree.py"), "--dir", tr.case.checkpoint_root(), "--job", JOB,
           "--cutover", cid, "--after-batch", str(AGREED), "--generation", str(generation)]
    run = run_process(cmd, log=tr.base / "agreement.log", env=env, timeout_s=STEP_TIMEOUT_S)
    tr.result.logs.append(run.log)
    if fault is not None and marker is not None:
        tr._witness(fault, run, marker)
    if run.returncode == 0:
        return True
    if fault is None or run.returncode != -signal.SIGKILL:
        tr.result.problems.append(f"the agreement failed (exit {run.returncode}):\n{run.tail()}")
    return False


def _stop_blue_unless_it_took_the_request(tr: TrialRun, store: CutoverStore, cid: str, generation: int,
                                          blue: _Driver) -> None:
    """After a call-off before the agreement, blue stops after N only if it took its
    ``stop_after`` before the call-off withdrew it (and found the cutover still open);
    withdrawn or refused, blue runs on untouched, and a person stops it (a plain stop) for
    the restart the trial ends with. Either way blue's lineage resumes exactly."""
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    channel = ControlChannel(store.catalog)
    ids = [rid for rid in channel.request_ids() if (r := channel.read_request(rid)).kind == "stop_after"
           and r.cutover == cid]
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline and not blue.join(0.5):
        states = {channel.result(rid).state for rid in ids}
        if states and states <= {"expired", "failed"}:
            tr.result.notes.append(f"blue's stop_after {ids} was {'/'.join(sorted(states))}: "
                                   "blue runs on; stopped")
            stop = channel.submit("stop", generation=generation, timeout_s=STEP_TIMEOUT_S)
            channel.wait(stop.id, timeout_s=STEP_TIMEOUT_S, poll_s=0.3)
            return


def _call_off(tr: TrialRun, store: CutoverStore, cid: str, reason: str) -> None:
    from airflow_sparkpoint.services.cutover import call_off

    end = call_off(store.catalog, cid, reason=reason, by="chaos")
    tr.result.notes.append(f"cutover {cid}: {end.outcome} at {end.step} ({end.reason})")
