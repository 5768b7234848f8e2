"""`SparkpointPreflightOperator` without Spark: which of blue's checkpoints it drills (the
newest; the one before when no batch ran; blue's new newest when retention removed the
drilled one), that a failed drill refuses the deploy with the drill's (Spark's) error,
and that nothing of blue's is written meanwhile. The drill itself is the verify
operator's (`drill`, replaced here; the real one runs in tests/integration/test_preflight.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import open_storage
from tests.support.records import put_checkpoint, write_status
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def operator(tmp_path: Path, **overrides: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointPreflightOperator

    kwargs: dict[str, Any] = {
        "task_id": "preflight", "job_name": "totals", "checkpoint_dir": str(tmp_path / "prod"),
        "application": "green.py", "application_args": ["--input", "/in", "--output", "/prod/out"],
        "output_args": {"--output": "{scratch}/out"}, "drill_dir": str(tmp_path / "drills"),
    }
    kwargs.update(overrides)
    return SparkpointPreflightOperator(**kwargs)


def blue(tmp_path: Path, checkpoints: int) -> Catalog:
    catalog = Catalog(open_storage(str(tmp_path / "prod")), "totals")
    catalog.claim_generation()
    for batch in range(checkpoints):
        put_checkpoint(catalog, {f"state/0/0/{batch + 1}.delta": f"state {batch}".encode()}, batch_id=batch)
    return catalog


def blue_files(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "prod"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class Drills:
    """Stands in for `SparkpointVerifyOperator.drill`: records the drilled checkpoints and
    answers each with the next outcome (a run result's batch count, or an error)."""

    def __init__(self, *outcomes: int | str, before: Any = None) -> None:
        self.outcomes = list(outcomes)
        self.drilled: list[int] = []
        self.before = before

    def __call__(self, context: Any, handle: SnapshotHandle) -> tuple[dict[str, Any], dict[str, Any]]:
        from airflow_sparkpoint.operators.verify import DrillFailed

        self.drilled.append(handle.metadata.batch_id)
        if self.before is not None:
            self.before(handle)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, str):
            raise DrillFailed(outcome)
        return ({"snapshot_batch": handle.metadata.batch_id},
                {"batches_processed": outcome, "job": "totals-preflight"})


def test_it_always_drills_blues_newest_checkpoint_under_its_own_name(tmp_path):
    with pytest.raises(ConfigError, match="remove snapshot="):
        operator(tmp_path, snapshot="latest_savepoint")
    op = operator(tmp_path)
    assert (op.snapshot, op.drill_job) == ("latest", "totals-preflight")
    with pytest.raises(ConfigError, match="production job's name"):
        operator(tmp_path, drill_job="totals").execute({"ti": None})


def test_a_compatible_green_passes_on_blues_newest_checkpoint(tmp_path, monkeypatch):
    blue(tmp_path, 3)
    op = operator(tmp_path)
    drills = Drills(2)
    monkeypatch.setattr(op, "drill", drills)
    summary = op.execute({"ti": None})
    assert drills.drilled == [2] and summary["ok"] and summary["batch_id"] == 2


def test_a_green_that_cannot_read_the_state_is_refused_with_the_drills_error_and_blue_untouched(
    tmp_path, monkeypatch
):
    from airflow.sdk.exceptions import AirflowException

    catalog = blue(tmp_path, 2)
    before = blue_files(tmp_path)
    op = operator(tmp_path)
    spark_error = ("[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not "
                   "match existing state")
    monkeypatch.setattr(op, "drill", Drills(f"the application failed: job failed: {spark_error}"))
    with pytest.raises(AirflowException, match=r"pre-flight refused: green \(green.py\) cannot restore job "
                                               r"'totals'.s checkpoint .*chk-2 \(batch 1\); "
                                               r"blue was left running"
                       ) as failure:
        op.execute({"ti": None})
    assert spark_error in str(failure.value)
    assert blue_files(tmp_path) == before, "the pre-flight wrote to blue's store (e.g. a verification record)"
    assert catalog.current_generation() == 1


def test_with_no_input_since_the_newest_checkpoint_it_replays_from_the_one_before(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    blue(tmp_path, 3)
    op = operator(tmp_path)
    drills = Drills(0, 1)
    monkeypatch.setattr(op, "drill", drills)
    summary = op.execute({"ti": None})
    assert drills.drilled == [2, 1] and summary["batch_id"] == 1
    assert [t["outcome"] for t in summary["tried"]] == ["no batch ran: the state was not read", "restored"]

    blue(tmp_path / "single", 1)
    lonely = operator(tmp_path / "single")
    monkeypatch.setattr(lonely, "drill", Drills(0))
    with pytest.raises(AirflowException, match="pre-flight inconclusive: .* ran no batch"):
        lonely.execute({"ti": None})


def test_a_checkpoint_blues_retention_removed_during_the_drill_is_not_greens_fault(tmp_path, monkeypatch):
    catalog = blue(tmp_path, 2)

    def retire_and_checkpoint(handle: SnapshotHandle) -> None:
        if handle.metadata.batch_id == 1:  # blue moves on while the first drill reads chk-2
            put_checkpoint(catalog, {"state/0/0/3.delta": b"state 2"}, batch_id=2)
            shutil.rmtree(handle.uri.removeprefix("file://"))

    op = operator(tmp_path)
    drills = Drills("the application failed: file not found: chk-2/...", 1, before=retire_and_checkpoint)
    monkeypatch.setattr(op, "drill", drills)
    summary = op.execute({"ti": None})
    assert drills.drilled == [1, 2] and summary["batch_id"] == 2
    assert summary["tried"][0]["outcome"] == "retired by blue during the drill"


def running(catalog: Catalog, trigger: str = "processingTime:1s") -> None:
    """Blue's run is live (its heartbeat fresh), started with `trigger`."""
    config = {"trigger": trigger, "commit.mode": "checkpoint"}
    generation = catalog.claim_generation({"config": config}).generation
    write_status(catalog, "running", generation=generation, last_batch=2, host="elsewhere", pid=1)


def test_zero_downtime_plans_the_cutover_after_a_passed_drill_and_hands_green_its_settings(
    tmp_path, monkeypatch
):
    from airflow_sparkpoint.checkpoints.cutover import CutoverStore

    catalog = blue(tmp_path, 3)
    running(catalog)
    op = operator(tmp_path, zero_downtime=True, cutover_dir=str(tmp_path / "green"), cutover_compare=True)
    monkeypatch.setattr(op, "drill", Drills(2))
    ti = FakeTI()
    summary = op.execute({"ti": ti})
    cutover = summary["cutover"]
    state = CutoverStore(catalog).read(cutover["cutover_id"])
    assert (state.step, state.plan.blue_generation, state.plan.mode) == ("planned", 2, "compare")
    assert state.plan.warmup_uri == catalog.checkpoint_uri(catalog.latest().id)  # type: ignore[union-attr]
    assert ti.pushed["cutover_id"] == state.id
    assert ti.pushed["green_conf"] == cutover["green_conf"] == {
        "spark.sparkpoint.shadow.mode": "compare",
        "spark.sparkpoint.shadow.dir": f"{tmp_path / 'green'}/{state.id}",
        "spark.sparkpoint.shadow.job": "totals-shadow", "spark.sparkpoint.shadow.from": state.plan.warmup_uri,
        "spark.sparkpoint.cutover": state.id}


def test_zero_downtime_plans_nothing_when_the_drill_refuses_green_or_blue_cannot_stop_after_a_batch(tmp_path,
                                                                                                    monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.checkpoints.cutover import CutoverStore

    with pytest.raises(ConfigError, match="cutover lag_batches=-1 is invalid; expected an integer >= 0"):
        operator(tmp_path, zero_downtime=True, cutover_lag_batches=-1)  # the service's rule, at parse time
    with pytest.raises(ConfigError, match="zero_downtime=True needs cutover_dir"):
        operator(tmp_path, zero_downtime=True, drill_dir=None)
    catalog = blue(tmp_path, 2)
    running(catalog)
    op = operator(tmp_path, zero_downtime=True)
    monkeypatch.setattr(op, "drill", Drills("the application failed: schema"))
    with pytest.raises(AirflowException, match="pre-flight refused"):
        op.execute({"ti": FakeTI()})
    assert CutoverStore(catalog).ids() == []

    running(catalog, trigger="availableNow")
    op = operator(tmp_path, zero_downtime=True)
    monkeypatch.setattr(op, "drill", Drills(1))
    with pytest.raises(AirflowException, match="cannot be planned: .*trigger='availableNow'"):
        op.execute({"ti": FakeTI()})
    assert CutoverStore(catalog).ids() == []


def test_the_cutover_operator_fails_naming_a_called_off_cutover(tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from airflow_sparkpoint.checkpoints.cutover import CutoverStore
    from airflow_sparkpoint.operators import SparkpointCutoverOperator
    from airflow_sparkpoint.services.zero_downtime import plan_cutover

    catalog = blue(tmp_path, 2)
    running(catalog)
    cid = plan_cutover(catalog, green_root=str(tmp_path / "green"), requested_by="t").plan.id
    CutoverStore(catalog).end(cid, "aborted", step="warmup", reason="called off by ops")
    op = SparkpointCutoverOperator(task_id="cutover", job_name="totals",
                                   checkpoint_dir=str(tmp_path / "prod"),
                                   cutover_id=cid, cutover_within="1 minute", poll_interval=0.05)
    with pytest.raises(AirflowException,
                       match=f"cutover {cid} of job 'totals' ended aborted at warmup: called off"):
        op.execute({"ti": FakeTI()})
