"""A rollback of a superseded generation beside a newer lineage that started from a
savepoint whose source checkpoint is gone, with real drivers and the real `sparkpoint`
command (found by a review in the simulation, 2026-11-30; pinned there in
tests/simulation/test_found.py).

Generation 1 (external commit mode, ``numRetained=1``) is held before staging batch 2
while a savepoint S is copied from its checkpoint of batch 1; it goes on through batch 3,
and its retention deletes S's source checkpoint. Generation 2 restores S by path (its
recovery aborts generation 1's batches 2 and 3, which S does not confirm, and keeps
batches 0 and 1 for the commit step) and is held after recording its first batch, before
its first checkpoint. ``sparkpoint commit --abort-generation 1`` looked for a newer
lineage only among the root's checkpoints and the origins' bases, aborted batches 0 and
1, which S confirms, and generation 2 forgot them: the commit step published its batches
without them. The rollback is refused now, and once generation 2 ends the commit step
leaves the sink exactly the input, once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sink_cases import DirectoryCase
from tests.support.sink_races import JOB, Scene, differences, explain, write_inputs
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")
EXTERNAL = {"spark.sparkpoint.commit.mode": "external", "spark.sparkpoint.checkpoint.numRetained": "1"}


def _commit(scene: Scene, *args: str) -> subprocess.CompletedProcess[str]:
    """`sparkpoint commit` of the scene's job and its declared sink, with `args`."""
    return subprocess.run([SPARKPOINT, "commit", *args, "--dir", scene.case.checkpoint_root(), "--job", JOB,
                           "--sink", f"directory:{scene.case.output()}", "--sink-option", "format=json"],
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_rollback_of_a_generation_a_savepoint_lineage_continues_is_refused(tmp_path: Path) -> None:
    scene = Scene(tmp_path, DirectoryCase(tmp_path))
    try:
        expected = write_inputs(scene.inputs, range(4))
        first = scene.start("first", EXTERNAL, pause=("stage:2",))
        held = first.wait_for("stage")
        assert held is not None and held["batch"] == 2, first.tail()
        catalog = scene.catalog()
        wait_for("generation 1's checkpoint of batch 1",
                 lambda: any(m.batch_id == 1 for m in catalog.checkpoints()), 120, first.tail)
        source = next(m for m in catalog.checkpoints() if m.batch_id == 1)
        savepoint = catalog.create_savepoint(catalog.handle(source))
        first.release("stage")
        assert first.wait() == 0, explain([first], catalog)
        assert source.id not in {m.id for m in catalog.checkpoints()}, "retention kept the savepoint's source"

        second = scene.start("second", EXTERNAL, pause=("recorded:2",), restore=savepoint.uri)
        recorded = second.wait_for("recorded")
        assert recorded is not None and recorded["batch"] == 2, second.tail()
        rollback = _commit(scene, "--abort-generation", "1")
        second.release("recorded")
        assert second.wait() == 0, explain([first, second], scene.catalog())
        assert rollback.returncode == 1 and "a newer run continues it" in rollback.stderr, (
            f"the rollback of generation 1 was not refused (exit {rollback.returncode}):\n"
            f"{rollback.stdout}{rollback.stderr}")

        step = _commit(scene)
        assert step.returncode == 0, step.stdout + step.stderr
        problems = differences(scene.case, expected, scene.case.rows())
        assert not problems, "\n".join(problems) + "\n" + explain([first, second], scene.catalog())
        assert scene.case.leftovers(JOB) == [] and scene.catalog().transactions() == []
    finally:
        scene.stop()
