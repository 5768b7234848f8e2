"""A streaming job that must read its backlog in its first micro-batch and then nothing
more while a test runs (blue, whose later input is green's).

Spark fires a ``processingTime`` trigger at the multiples of its interval since the epoch
(``ProcessingTimeExecutor.nextBatchTime``), not one interval after the last batch: a
10-minute trigger fires again at the next round ten minutes of the clock, anywhere from 0
to 10 minutes away. A test that was slow (a loaded machine) then saw blue read green's
input. The interval here puts the next firing weeks away, and `idle_trigger` checks that.
"""

from __future__ import annotations

import time

INTERVAL_H = 10_000


def idle_trigger(for_s: float = 86_400.0) -> str:
    """The trigger of a job that fires once now and not again within `for_s` seconds.

    :raises AssertionError: the next firing is sooner (the premise of such a test).
    """
    interval = INTERVAL_H * 3600
    now = time.time()
    next_firing = (now // interval + 1) * interval
    assert next_firing - now > for_s, \
        f"a processingTime:{INTERVAL_H}h trigger fires again in {next_firing - now:.0f} s"
    return f"processingTime:{INTERVAL_H}h"
