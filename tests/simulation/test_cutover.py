"""The zero-downtime cutover (issue 49) in the simulation, pinned: blue (a0) is held
before it stages batch 2 until the orchestrator (a1) filed its ``stop_after`` request;
then blue serves it, stops after the agreed batch, and green claims and continues with
other code. The schedule's own checks (every batch once, one lineage's rows, nothing
left) hold; these tests add what each path must have done."""

from __future__ import annotations

from typing import Any

import pytest

from tests.simulation import actors
from tests.simulation.actors import CutoverSpec, DriverSpec
from tests.simulation.scheduler import Pause, ScriptedChooser
from tests.simulation.simulate import ActorSpec, Schedule, run_schedule


@pytest.fixture()
def outcomes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    found: list[Any] = []
    real = actors.cutover

    def cutover(world: Any, spec: CutoverSpec, name: str) -> Any:
        result = real(world, spec, name)
        found.append(result)
        return result

    monkeypatch.setattr(actors, "cutover", cutover)
    return found


def _schedule(sink: str, margin: int, *rest: ActorSpec) -> Schedule:
    return Schedule(sink, 6, (ActorSpec("driver", DriverSpec(budget=6, num_retained=2)),
                              ActorSpec("cutover", cutover=CutoverSpec(margin=margin, version=2, budget=3)), *rest))


HOLD_BLUE = Pause("a0", ("sink.stage",), until="a1", release=("put_if_absent sim/control/",), occurrence=3)


@pytest.mark.parametrize("sink", ["directory", "delta"])
def test_green_takes_over_after_the_agreed_batch(sink: str, outcomes: list[Any]) -> None:
    run_schedule(_schedule(sink, 1), ScriptedChooser([HOLD_BLUE]))
    assert outcomes == ["green took over at batch 2"]


def test_a_stop_after_below_the_started_batch_is_refused_and_blue_keeps_running(outcomes: list[Any]) -> None:
    """N = blue's last batch - 1: blue refuses (already past N) and runs on; the
    orchestrator calls the cutover off, tries again with a larger N (a new cutover)."""
    outcome = run_schedule(_schedule("directory", -1), ScriptedChooser([HOLD_BLUE]))
    refusals = [line for line in outcome.trace if "refused stop_after request" in line]
    assert refusals and "already past batch 0: batch 2 has started" in refusals[0]
    assert not any("a0-driver failed" in line for line in outcome.trace)
    assert len(outcomes) == 1  # then a new cutover with a larger N, or blue drained first
