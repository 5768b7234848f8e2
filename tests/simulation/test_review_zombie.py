"""Review of 4c4e375 (checkpoint ids freed by retention, a zombie's late ``_metadata``):
pinned schedules that fail on that code, each naming its window. Not fixed here."""

from __future__ import annotations

from tests.simulation.actors import DriverSpec
from tests.simulation.scheduler import Pause, ScriptedChooser
from tests.simulation.simulate import ActorSpec, Schedule, run_schedule


def _driver(**settings: object) -> ActorSpec:
    return ActorSpec("driver", DriverSpec(**settings))  # type: ignore[arg-type]


def test_the_commit_step_takes_a_zombies_late_checkpoint_at_or_below_a_savepoint_lineages_base() -> None:
    """Fails on 4c4e375 (and before it): "a retry with restore=latest after this
    schedule did not resume the job", every restore refused with "transaction sim-b4-g2
    (batch 4), which …/savepoint-6-… lists as confirmed, was aborted since". a0
    (generation 1, external mode) checkpoints batches 0..3 (chk-1..4), uploads its files
    of batch 4 and waits before its ``_metadata`` of chk-5 (its fence check passed). a1
    (2) restores chk-4, checkpoints chk-5 (batch 4) and chk-6 (batch 5), its retention
    (numRetained=1; its rollback point is its base chk-4) deleting chk-5; it serves a2's
    savepoint S (a copy of chk-6: pending batches 4 and 5 of generation 2) and
    checkpoints chk-7. a3 (3) restores chk-7, checkpoints chk-8; its retention deletes
    chk-4 and prunes generation 2's origin (it supersedes nothing left). a0 wakes:
    ``put_if_absent(chk-5/_metadata)`` lands in the id a1's retention freed, its files
    still there: a valid checkpoint of generation 1 (batch 4) that no origin supersedes.
    a4 (4) restores S by path (origin: savepoint, base 6: chk-7 and chk-8 superseded,
    chk-5 not), keeps S's pending transactions for the commit step and dies at its first
    stage. a5, the commit step: ``latest()`` is generation 1's chk-5, which does not list
    generation 2's batch 4, at or below its batch 4: aborted, though a4's restart point
    (S) confirms it. Batch 4's output is lost and no snapshot can be restored any more.
    """
    schedule = Schedule("directory", 8, (
        _driver(budget=5, num_retained=6, commit_mode="external"),
        _driver(budget=3, num_retained=1, commit_mode="external"),
        ActorSpec("savepoint"),
        _driver(budget=1, num_retained=1, commit_mode="external"),
        _driver(restore="path", budget=1, num_retained=6, commit_mode="external"),
        ActorSpec("commit"),
    ))
    run_schedule(schedule, ScriptedChooser([
        Pause("a0", ("put_if_absent sim/chk-",), "a3", occurrence=5),
        Pause("a1", ("put_if_absent sim/chk-",), "a2", ("put_if_absent sim/control/",), occurrence=2),
        Pause("a4", ("sink.stage",), crash=True),
    ], options=[3]))
