"""Every reader of "the current run's status" sees the live generation after a zombie's
late heartbeat replaced ``status.json`` (`checkpoints.status.current_status`): the
history model, the generation records, the sensor's condition and trigger, and the
submit operator's reading of its failed run's error."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.storage.local import LocalStorage
from tests.support.records import put_checkpoint, write_status

pytestmark = pytest.mark.airflow

JOB = "orders"  # the job of the `catalog` fixture (conftest.py)
TOKEN = "submit-token-2"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def write(catalog: Catalog, generation: int, state: str, *, error: str | None = None, completed: int = 0,
          last: int | None = None) -> None:
    """A status record as `generation`'s run writes it (its own record, then status.json)."""
    write_status(catalog, state, generation=generation, error=error, checkpoints_completed=completed,
                 last_checkpoint_id=last)


def zombie_after_a_new_claim(catalog: Catalog, state: str = "running", error: str | None = None) -> None:
    """Generation 1 runs; generation 2 (submit `TOKEN`) claims and writes `state`; then
    generation 1's late heartbeat lands and replaces status.json."""
    catalog.claim_generation()
    write(catalog, 1, "running")
    catalog.claim_generation({"submitter": TOKEN})
    write(catalog, 2, state, error=error)
    write(catalog, 1, "running")  # the zombie's heartbeat, written after the claim
    assert catalog.read_status() is not None and catalog.read_status()["generation"] == 1  # type: ignore[index]


def test_the_history_and_generation_records_show_the_live_generation(catalog: Catalog) -> None:
    from airflow_sparkpoint.checkpoints.history import generation_records, load_history, read_generation

    zombie_after_a_new_claim(catalog, "failed", error="boom")
    history = load_history(catalog)
    assert history.status is not None and history.status.generation == 2, history.status
    newest = generation_records(catalog)[0]
    assert (newest.generation, newest.outcome, newest.error) == (2, "failed", "boom"), newest
    alone = read_generation(catalog, 2)
    assert (alone.outcome, alone.error) == ("failed", "boom"), alone


def test_the_condition_sees_the_live_generations_status(catalog: Catalog) -> None:
    from airflow_sparkpoint.services.conditions import CheckpointCondition, evaluate, observe

    zombie_after_a_new_claim(catalog)
    cond = CheckpointCondition(job_name=JOB, generation=2)
    seen = observe(catalog, cond)
    assert seen.status is not None and seen.status.generation == 2, seen.status
    outcome = evaluate(catalog, cond)
    assert not outcome.done and not outcome.failed, outcome
    assert "has not reported a status yet" not in outcome.waiting_for, outcome


def test_a_waiting_trigger_sees_the_live_generation_past_a_zombies_heartbeat(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sparkpoint.triggers import SparkpointCheckpointTrigger

    catalog.claim_generation()
    catalog.claim_generation()
    write(catalog, 2, "running")
    trigger = SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=catalog.storage.uri, generation=2,
                                          poll_interval=5)
    assert trigger.poll(catalog) is None  # the full look: generation 2 runs, no checkpoint yet
    gets: list[str] = []
    original = LocalStorage.get

    def counted(self: LocalStorage, key: str, *args: object, **kwargs: object) -> bytes:
        gets.append(key.removeprefix(f"{JOB}/"))
        return original(self, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalStorage, "get", counted)
    write(catalog, 2, "running")  # a heartbeat: one GET per poll
    assert trigger.poll(catalog) is None
    assert gets == [layout.STATUS], gets
    gets.clear()
    write(catalog, 1, "running")  # the zombie's late heartbeat
    assert trigger.poll(catalog) is None
    assert gets[0] == layout.STATUS and layout.status_key(2) in gets, gets
    seen = trigger.watch.seen
    assert seen is not None and seen.status is not None and seen.status.generation == 2, seen
    monkeypatch.undo()
    checkpoint = put_checkpoint(catalog, generation=2)
    write(catalog, 2, "running", completed=1, last=checkpoint.id)
    write(catalog, 1, "running")  # the zombie hides generation 2's checkpoint from status.json
    event = trigger.poll(catalog)
    assert event is not None and event["status"] == "success" and event["checkpoint_id"] == checkpoint.id, \
        event


def test_reported_error_reads_the_failed_runs_own_record(catalog: Catalog) -> None:
    from airflow_sparkpoint.services import runs

    zombie_after_a_new_claim(catalog, "failed", error="boom")
    assert runs.reported_error(catalog, TOKEN) == "boom"
