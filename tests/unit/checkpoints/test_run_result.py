"""The run result record (`checkpoints.run_result`): one type, one store."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.run_result import RunResult, read_run_result, result_key, write_run_result
from airflow_sparkpoint.exceptions import CorruptMetadata
from airflow_sparkpoint.storage import MemoryStorage


def test_a_written_result_reads_back_equal() -> None:
    catalog = Catalog(MemoryStorage(), "orders")
    result = RunResult(status="stopped", job="orders", generation=3, batches_processed=2, first_batch=4,
                       last_batch=5, committed_batches=(4, 5), committed_ranges=((4, 5),),
                       savepoint=f"{catalog.uri}/savepoints/savepoint-3-ab12cd34",
                       recovered={"committed": [3]}, rescaled={"from": 2, "to": 4, "batch": 6})
    assert read_run_result(catalog, 3) is None
    write_run_result(catalog, result)
    assert read_run_result(catalog, 3) == result
    assert RunResult.from_json({**result.to_json(), "added_by_a_later_release": 1}) == result


def test_an_unreadable_result_is_named() -> None:
    catalog = Catalog(MemoryStorage(), "orders")
    catalog.store.put(result_key(2), b"[1, 2]")
    with pytest.raises(CorruptMetadata, match=r"results/000000000002\.json"):
        read_run_result(catalog, 2)
    catalog.store.put(result_key(2), b'{"job": "orders"}')
    with pytest.raises(CorruptMetadata, match="status"):
        read_run_result(catalog, 2)


def test_the_result_line_a_job_script_prints_reads_back() -> None:
    from airflow_sparkpoint.checkpoints.run_result import parse_result_line, result_line

    result = RunResult(status="finished", job="orders", generation=1, committed_batches=(0, 1))
    output = f"INFO starting\n{result_line(result)}\nINFO stopped\n"
    assert result_line(result).startswith("SPARKPOINT_RESULT {")
    assert parse_result_line(output) == result
    assert parse_result_line("INFO no result\n") is None


def test_batch_ranges_hold_exactly_the_ids_added_in_any_order() -> None:
    import random

    from airflow_sparkpoint.checkpoints.run_result import BatchRanges

    rng = random.Random(20261127)
    for _ in range(200):
        ids = [rng.randrange(0, 60) for _ in range(rng.randrange(0, 40))]
        if rng.random() < 0.5:
            ids.sort()
        ranges = BatchRanges(ids)
        expected = sorted(set(ids))  # the oracle: a plain set
        assert [b for first, last in ranges.ranges() for b in range(first, last + 1)] == expected, ids
        assert all(a[1] + 1 < b[0] for a, b in zip(ranges.ranges(), ranges.ranges()[1:])), \
            "disjoint, not adjacent"
        assert len(ranges) == len(expected)
        assert list(ranges.newest(7)) == expected[-7:]


def test_a_run_that_committed_for_weeks_lists_its_newest_batches_and_ranges_them_all() -> None:
    """A list of every committed batch grew without bound (400,000 ids in two weeks at a 3 s
    trigger) in the driver, the result record, XCom and the asset event."""
    from airflow_sparkpoint.checkpoints.run_result import COMMITTED_BATCHES_LISTED, BatchRanges

    committed = BatchRanges(range(100, 400_100))
    committed.add(400_200)  # a gap: a batch committed by restore-time recovery instead
    fields = RunResult.committed(committed)
    assert fields["committed_ranges"] == ((100, 400_099), (400_200, 400_200))
    assert len(fields["committed_batches"]) == COMMITTED_BATCHES_LISTED == 1000
    assert fields["committed_batches"][-2:] == (400_099, 400_200)
    result = RunResult(status="finished", job="orders", generation=1, **fields)
    data = result.to_json()
    assert data["committed_ranges"] == [[100, 400_099], [400_200, 400_200]]
    assert RunResult.from_json(data) == result
    small = RunResult.committed(BatchRanges([0, 1, 2]))
    assert small == {"committed_batches": (0, 1, 2), "committed_ranges": ((0, 2),)}, \
        "short runs list every batch"
