"""The commit watcher of a run: it feeds the coordinator each batch Spark commits in the
run's live location (`watch_commits`). Its own concern: the run's phases only start it."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from airflow_sparkpoint.runtime import livedir

__all__ = ["COMMIT_LISTING_INTERVAL_S", "COMMIT_WATCH_INTERVAL_S", "watch_commits"]

#: how often the commit watcher looks for Spark's next ``commits/<N>`` (one stat)
COMMIT_WATCH_INTERVAL_S = 0.05
#: how often it lists ``commits/`` whole
COMMIT_LISTING_INTERVAL_S = 2.0


def watch_commits(live: str, events: queue.Queue[tuple[str, Any]], stop: threading.Event,
                  seen: int | None) -> None:
    """Feed the coordinator's `events` each batch Spark commits in `live` (its
    ``commits/<N>`` file, written atomically), in order, from the batch after `seen` (the
    restored restart point), until `stop` is set.

    Not a streaming query listener: PySpark converts every progress event into Python
    with one JVM call per field (every source, state operator and metric): 30 ms of
    Python and 130 ms of JVM CPU per batch here (docs/BENCHMARKS.md), for a batch id
    that the commit log has first. A stat of the next ``commits/`` file per
    `COMMIT_WATCH_INTERVAL_S`; a full listing now and then in case one was skipped."""
    next_listing = time.monotonic() + COMMIT_LISTING_INTERVAL_S
    while not stop.wait(COMMIT_WATCH_INTERVAL_S):
        if time.monotonic() >= next_listing:  # the listing holds whatever the stats would find
            next_listing = time.monotonic() + COMMIT_LISTING_INTERVAL_S
            found = [b for b in livedir.committed_batches(live) if seen is None or b > seen]
        else:
            found = []
            batch = 0 if seen is None else seen + 1
            while livedir.is_committed(live, batch):
                found.append(batch)
                batch += 1
        for batch in found:
            events.put(("progress", batch))
        if found:
            seen = found[-1]
