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
                       last_batch=5, committed_batches=(4, 5),
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
