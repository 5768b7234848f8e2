"""Violations the exploration found that are not fixed yet, each repeated by its seed and
index (`explore.random_run`) as a strict xfail: it fails while the finding stands, and
turns into an unexpected pass, failing the run, once a fix lands (then pin its shrunk
schedule in `test_found.py` and remove it here)."""

from __future__ import annotations

import pytest

from tests.simulation.explore import random_run
from tests.simulation.simulate import Violation, run_schedule


@pytest.mark.xfail(strict=True, raises=Violation, reason=(
    "finding (seed 20261130, schedule 2705): after a cutover, a path restore that "
    "rewound the Delta sink, and a restore of the moved savepoint of the first lineage racing "
    "that run's upload, a retry with restore=latest is refused: 'sink … no longer holds batch 2 "
    "(sim-b2-g1), which the lineage of …/chk-5 committed'. The refused start changes "
    "nothing, but the job does not resume on its own"))
def test_seed_20261130_schedule_2705_a_retry_resumes_after_a_moved_savepoint_restore() -> None:
    schedule, chooser = random_run(20261130, 2705)
    run_schedule(schedule, chooser)
