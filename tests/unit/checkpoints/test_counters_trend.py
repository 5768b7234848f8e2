"""The checkpoint trend in the counters record: bounded, ordered, carried over restarts
and restores, and within the record's bounded read."""

from __future__ import annotations

import json

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.counters import (
    COUNTERS,
    TREND_LIMIT,
    CheckpointCounters,
    CheckpointPoint,
    CounterRecorder,
    read_counters,
)
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.checkpoints.layout import max_bytes_of


def point(cid: int) -> CheckpointPoint:
    return CheckpointPoint(id=cid, batch_id=cid * 2, completed_at=1_800_000_000.0 + cid,
                           duration_ms=100 + cid, bytes_copied=1000 * cid, bytes_total=10**12 + cid)


def test_the_trend_keeps_the_newest_points_in_order_within_the_bounded_record(catalog: Catalog) -> None:
    recorder = CounterRecorder(catalog, 1)
    for cid in range(1, TREND_LIMIT + 31):
        recorder.completed(1_800_000_000.0 + cid, point(cid))
    counters = read_counters(catalog)
    assert counters is not None and counters.completed == TREND_LIMIT + 30
    assert [p.id for p in counters.trend] == list(range(31, TREND_LIMIT + 31))
    assert counters.trend[-1] == point(TREND_LIMIT + 30)
    size = len(catalog.store.get(COUNTERS))
    limit = max_bytes_of(COUNTERS)
    assert limit is not None and size < limit / 10, (size, limit)


def test_the_trend_survives_a_restart_and_a_restore(catalog: Catalog) -> None:
    first = CounterRecorder(catalog, 1)
    for cid in (1, 2, 3):
        first.completed(None, point(cid))
    first.failed()  # a failed attempt adds no point
    # generation 2 restores (a restart, or a rollback to a savepoint: a new lineage of the
    # same job) and checkpoints on: its points follow the first generation's
    second = CounterRecorder(catalog, 2)
    second.restored()
    second.completed(None, point(4))
    second.completed(None)  # a caller without a point (counts only)
    counters = read_counters(catalog)
    assert counters is not None and (counters.generation, counters.completed, counters.restored) == (2, 5, 1)
    assert [p.id for p in counters.trend] == [1, 2, 3, 4]
    view = load_history(catalog).to_json()["trend"]
    assert [p["id"] for p in view] == [1, 2, 3, 4] and view[3] == point(4).as_dict()


def test_a_record_of_an_earlier_release_has_an_empty_trend_and_a_malformed_point_is_refused(
    catalog: Catalog
) -> None:
    catalog.store.put(COUNTERS, json.dumps({"schema_version": 1, "completed": 4, "recent": []}).encode())
    counters = read_counters(catalog)
    assert counters is not None and counters.trend == () and counters.completed == 4
    recorder = CounterRecorder(catalog, 3)
    recorder.completed(None, point(9))
    counters = read_counters(catalog)
    assert counters is not None and counters.completed == 5 and [p.id for p in counters.trend] == [9]
    with pytest.raises(ValueError, match=r"trend point \[1, 2\] is not"):
        CheckpointCounters.from_json({"schema_version": 1, "trend": [[1, 2]]})
