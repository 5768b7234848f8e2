"""The protocol explored by simulation (docs/PROTOCOL.md): Hypothesis chooses the actors,
their settings, every interleaving, the crashes and the stalls; the real code of every
actor runs (`tests.simulation`); each schedule's invariants are checked after every step
and at its end. A failure shrinks to a short schedule and prints its trace.

CI runs `SCHEDULES` schedules under the fixed seed and as many under a fresh one (both
printed); ``SPARKPOINT_SIM_SCHEDULES`` changes the count, ``SPARKPOINT_SIM_SEED`` the
fresh seed. `make explore` runs the long exploration (`tests.simulation.explore`).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.simulation.explore import run_hypothesis

#: schedules per seed in the default run (two seeds: at least 2,000 in all)
SCHEDULES = int(os.environ.get("SPARKPOINT_SIM_SCHEDULES", "1000"))
FIXED_SEED = 20261128


def _explore(seed: int) -> None:
    started = time.monotonic()
    ran = run_hypothesis(seed, SCHEDULES)
    print(f"simulation: seed {seed}: {ran} schedules in {time.monotonic() - started:.0f} s")
    assert ran >= SCHEDULES, f"seed {seed}: only {ran} of {SCHEDULES} schedules ran"


def test_fixed_seed() -> None:
    _explore(FIXED_SEED)


def test_fresh_seed() -> None:
    seed = int(os.environ.get("SPARKPOINT_SIM_SEED") or random.SystemRandom().randrange(2**31))
    print(f"simulation: fresh seed {seed} (SPARKPOINT_SIM_SEED={seed} repeats it)")
    _explore(seed)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
