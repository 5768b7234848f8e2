"""The protocol explored by simulation (docs/PROTOCOL.md): Hypothesis chooses the actors,
their settings, every interleaving, the crashes and the stalls; the real code of every
actor runs (`tests.simulation`); each schedule's invariants are checked after every step
and at its end. A failure shrinks to a short schedule and prints its trace.

CI runs `SCHEDULES` schedules under a fresh seed (a new search every run, printed) and
`FIXED_SCHEDULES` under the fixed one (a repeatable check; the schedules that once found a
violation are pinned in `test_found`); ``SPARKPOINT_SIM_SCHEDULES`` and
``SPARKPOINT_SIM_FIXED_SCHEDULES`` change the counts, ``SPARKPOINT_SIM_SEED`` the fresh
seed. `make explore` runs the long exploration (`tests.simulation.explore`).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.simulation.explore import run_hypothesis

#: schedules under the fresh seed in the default run
SCHEDULES = int(os.environ.get("SPARKPOINT_SIM_SCHEDULES", "1000"))
#: schedules under the fixed seed (the same every run: fewer, the fresh seed searches)
FIXED_SCHEDULES = int(os.environ.get("SPARKPOINT_SIM_FIXED_SCHEDULES", "400"))
FIXED_SEED = 20261128


def _explore(seed: int, schedules: int) -> None:
    started = time.monotonic()
    ran = run_hypothesis(seed, schedules)
    print(f"simulation: seed {seed}: {ran} schedules in {time.monotonic() - started:.0f} s")
    assert ran >= schedules, f"seed {seed}: only {ran} of {schedules} schedules ran"


def test_fixed_seed() -> None:
    _explore(FIXED_SEED, FIXED_SCHEDULES)


def test_fresh_seed() -> None:
    seed = int(os.environ.get("SPARKPOINT_SIM_SEED") or random.SystemRandom().randrange(2**31))
    print(f"simulation: fresh seed {seed} (SPARKPOINT_SIM_SEED={seed} repeats it)")
    _explore(seed, SCHEDULES)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
