"""The example blue-green DAG's zero-downtime path (param ``zero_downtime``) under a real
Airflow: blue is a real long-running streaming task (``dags/jobs/keyed_totals.py
--version 1``, ``processingTime``, in the ``e2e_stream`` test DAG), one input file per
micro-batch. The DAG's pre-flight restores green in scratch and plans the cutover, green
(``--version 2``) warms up beside blue as its shadow in its own task, and the cutover task
agrees N; then the input through N + 4 arrives, blue's task ends ``stopped`` after N, green
claims the job and commits N+1 on. The test then stops green with a control request.

Oracle (plain Python from the input files, one file = one batch): every user's total and
event count over all input; its ``code_version`` is 2 iff one of its files was a batch
after N (green's), else 1; every batch committed exactly once, through N by blue's
generation and after it by green's. The output gap (blue's commit of N to green's commit
of N+1) is printed, not asserted.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.demo.support import delta_commits, delta_history, delta_rows, orphaned_staged_files
from tests.e2e.stack import AirflowApi, AirflowStack
from tests.support.totals_pipeline import EXAMPLE_JOBS, Totals, running_with_checkpoint
from tests.support.waits import wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]  # two streaming drivers, minutes

DAG = "example_sparkpoint_blue_green"
TRIGGER_S = 2.0
# Blue's backlog arrives before the deploy; no input while green warms up (a replay costs
# green a query start and a Python worker per batch: on a loaded 2-core machine ~14 s, more
# than any input pace a test can wait for); once N is agreed, the files through N + AFTER_N
# arrive at once (`Feeder.rush`), so the gap measured is the handover's, not the input's.
BACKLOG = 6
AFTER_N = 4


def users_of(index: int) -> list[str]:
    return sorted({f"u{(index * 3 + j) % 5}" for j in range(1 + index % 3)})


def amount(index: int, user: str) -> int:
    return index * 10 + int(user[1:])


def oracle(files: list[list[str]], n: int) -> dict[str, tuple[int, int, int]]:
    """(total, events, code_version) by user: files 0..n are blue's batches, the rest green's."""
    totals: dict[str, tuple[int, int, int]] = {}
    for index, users in enumerate(files):
        for user in users:
            total, events, version = totals.get(user, (0, 0, 1))
            totals[user] = (total + amount(index, user), events + 1, 2 if index > n else version)
    return totals


class Feeder:
    """Writes input file i every `pace_s` seconds on its own thread until stopped."""

    def __init__(self, pipeline: Totals, pace_s: float) -> None:
        self.pipeline, self.pace_s = pipeline, pace_s
        self.files: list[list[str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._feed, name="feeder", daemon=True)

    def write_next(self) -> int:
        with self._lock:
            index = len(self.files)
            users = users_of(index)
            self.pipeline.write((u, amount(index, u)) for u in users)
            self.files.append(users)
            return index

    def _feed(self) -> None:
        while not self._stop.wait(self.pace_s):
            self.write_next()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)

    def rush(self, through: int) -> None:
        """Stop pacing; write every file through index `through` now."""
        self.stop()
        while len(self.files) <= through:
            self.write_next()


def test_zero_downtime_blue_green_hands_a_streaming_blue_task_over_at_an_agreed_batch_exactly_once(
    airflow_api: AirflowApi, airflow_stack: AirflowStack, tmp_path: Path
) -> None:
    pipeline = Totals(tmp_path, "bg_zero", root=airflow_stack.home / "sparkpoint")
    feeder = Feeder(pipeline, 3600.0)  # paced writes never come: `rush` writes after the agreement
    for _ in range(BACKLOG):
        feeder.write_next()
    blue = airflow_api.trigger("e2e_stream", pipeline.params(
        script=str(EXAMPLE_JOBS / "keyed_totals.py"), version=1, files_per_batch=1,
        trigger=f"processingTime:{TRIGGER_S:g} seconds",
        # Blue checkpoints every batch: keep enough of them that blue's retention does not
        # remove the pre-flight's and green's warm-up checkpoint while their JVMs start on a
        # loaded machine (a cluster's retention window is its checkpoint interval x numRetained)
        num_retained="200"))
    describe_blue = lambda: airflow_api.describe("e2e_stream", blue)
    blue_generation = wait_for(f"blue's checkpoint of batch {BACKLOG - 1}",
                               lambda: running_with_checkpoint(pipeline, BACKLOG - 1), 600, describe_blue)
    assert blue_generation is not None
    feeder.thread.start()
    run = ""
    try:
        run = airflow_api.trigger(DAG, {
            "job_name": pipeline.job, "input": str(pipeline.input), "output": str(pipeline.output),
            "zero_downtime": True, "green_trigger": f"processingTime:{TRIGGER_S:g} seconds",
            "cutover_dir": str(tmp_path / "cutover")})
        describe = lambda: airflow_api.describe(DAG, run)

        def agreed() -> int | None:
            store = CutoverStore(pipeline.catalog)
            states = [store.read(cid) for cid in store.ids()]
            if any(s.done is not None and s.done.outcome == "aborted" for s in states):
                raise AssertionError(f"the cutover was called off: {[s.done for s in states]}\n{describe()}")
            return next((s.agreed.after_batch for s in states if s.agreed is not None), None)

        agreed_n = wait_for("the cutover's agreement", agreed, 1500, describe)
        assert agreed_n is not None
        feeder.rush(agreed_n + AFTER_N)
        airflow_api.wait_task(DAG, run, "cutover", {"success"}, timeout=900)
        outcome = airflow_api.xcom(DAG, run, "cutover")
        n, green_generation = outcome["after_batch"], outcome["green_generation"]
        assert outcome["step"] == "committed" and green_generation == blue_generation + 1, outcome
        # Blue's task ended by its stop after N.
        airflow_api.wait_task("e2e_stream", blue, "job", {"success"}, timeout=300)
        blue_result = airflow_api.xcom("e2e_stream", blue, "job")
        assert (blue_result["status"], blue_result["last_batch"]) == ("stopped", n), blue_result
    finally:
        feeder.stop()
    last = len(feeder.files) - 1
    catalog = pipeline.catalog

    def green_committed(batch: int) -> bool:
        return any(c["batch"] == batch and c["generation"] == green_generation
                   for c in delta_commits(pipeline.output))

    wait_for(f"green's commit of the last batch {last}", lambda: green_committed(last), 300, describe)
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=green_generation, timeout_s=300)
    channel.wait(request.id, timeout_s=300, poll_s=1.0)
    assert airflow_api.wait_run(DAG, run, timeout=600) == "success", describe()
    states = airflow_api.task_states(DAG, run)
    assert {t: states[t]
            for t in ("deploy_path", "preflight_zero_downtime", "start_green_zero_downtime", "cutover",
                      "stop_blue", "start_green", "restore_blue_after_cutover",
                      "cutover_called_off")} == {
        "deploy_path": "success", "preflight_zero_downtime": "success",
        "start_green_zero_downtime": "success",
        "cutover": "success", "stop_blue": "skipped", "start_green": "skipped",
        "restore_blue_after_cutover": "skipped", "cutover_called_off": "skipped"}, describe()
    green = airflow_api.xcom(DAG, run, "start_green_zero_downtime")
    assert (green["generation"], green["status"], green["first_batch"], green["last_batch"]) == (
        green_generation, "stopped", n + 1, last), green

    # Exactly once: one Delta commit per batch, through N by blue, after N by green.
    commits = delta_commits(pipeline.output)
    assert sorted((c["batch"], c["generation"]) for c in commits) == (
        [(b, blue_generation) for b in range(n + 1)]
        + [(b, green_generation) for b in range(n + 1, last + 1)])
    assert orphaned_staged_files(pipeline.output, pipeline.job) == []
    rows = delta_rows(pipeline.output)
    table = {r["user"]: (int(r["total"]), int(r["events"]), int(r["code_version"])) for r in rows}
    assert len(table) == len(rows), rows
    assert table == oracle(feeder.files, n)

    # The cutover's records: committed by green, shown with its state.
    state = CutoverStore(catalog).read(outcome["cutover_id"])
    assert (state.step, state.claimed.generation, state.agreed.after_batch) == (  # type: ignore[union-attr]
        "committed", green_generation, n)
    log = airflow_api.log(DAG, run, "cutover", 1)
    for step in ("warm-up:", f"agreed: blue stops after batch {n}", "committed through batch",
                 f"green claimed the job as generation {green_generation}",
                 "green committed its first batch"):
        assert step in log, step

    at = {c["batch"]: c["timestamp"] for c in delta_history(pipeline.output) if c["batch"] is not None}
    gap = (at[n + 1] - at[n]) / 1000.0
    print(f"\nzero-downtime output gap on the Airflow stack: {gap:.2f} s from blue's commit of batch {n} to "
          f"green's commit of batch {n + 1} (trigger {TRIGGER_S:g} s; "
          f"{outcome['seconds']:.0f} s of cutover task)")
