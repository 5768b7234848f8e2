"""A batch that can never be merged (duplicate merge keys) fails while it is staged,
before its checkpoint completes, so it never becomes a poison batch: the job fails with
an error naming the sink, the key columns and the offending keys; the user fixes the
query; the restart from the last checkpoint produces the exact output. Real
``spark-submit`` drivers; the oracle is computed from the input files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from tests.support.sink_races import Driver, start_sink_driver, write_input

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

JOB = "poison"
SCRIPT = Path(__file__).resolve().parent / "jobs" / "merge_key_job.py"
FILES = [
    [{"id": 1, "user": "u0", "amount": 1}, {"id": 2, "user": "u1", "amount": 2}],
    [{"id": 3, "user": "u1", "amount": 4}, {"id": 4, "user": "u2", "amount": 8}],
    # "U1" and "u1" in one batch: one merge key under lower(user)
    [{"id": 5, "user": "U1", "amount": 16}, {"id": 6, "user": "u1", "amount": 32},
     {"id": 7, "user": "u2", "amount": 64}],
    [{"id": 8, "user": "u0", "amount": 128}, {"id": 9, "user": "U1", "amount": 256}],
]


def totals(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    want: dict[str, tuple[int, int]] = {}
    for row in rows:
        total, events = want.get(row["user"], (0, 0))
        want[row["user"]] = (total + row["amount"], events + 1)
    return want


def test_duplicate_merge_keys_fail_the_batch_before_its_checkpoint_and_the_fixed_query_resumes(
    tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    inputs, table, root = tmp_path / "input", tmp_path / "table", tmp_path / "checkpoints"
    expected: list[dict[str, Any]] = []
    for i, rows in enumerate(FILES):
        expected += write_input(inputs, f"events-{i}", 10 * i, rows)
    conf = {"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB}

    def run(name: str, key: str) -> Driver:
        driver = start_sink_driver(name, tmp_path, conf=conf, script=SCRIPT,
                        args=["--input", str(inputs), "--output", str(table), "--key", key])
        driver.wait()
        return driver

    poisoned = run("poisoned", "lower")

    assert poisoned.proc.returncode != 0, poisoned.tail()
    assert "merge key(s) ['key'] with more than one row" in poisoned.output, poisoned.tail()
    assert f"DeltaSink('{table}', mode='merge', keys=['key']" in poisoned.output
    assert "{key='u1'} x2" in poisoned.output and "batch 2 of job 'poison'" in poisoned.output
    catalog = Catalog.open(str(root), JOB)
    latest = catalog.latest()
    assert latest is not None and latest.batch_id == 1, "the bad batch must fail before its checkpoint"
    assert DeltaTable(str(table)).transaction_version(JOB) == 1
    assert catalog.transactions() == [], "the bad batch must not be recorded"

    fixed = run("fixed", "exact")

    assert fixed.proc.returncode == 0, fixed.tail()
    result = fixed.result
    assert result is not None and result["committed_batches"] == [2, 3] and result["first_batch"] == 2
    got = {r["key"]: (r["total"], r["events"]) for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()}
    assert got == totals(expected)
    staging = table / "_sparkpoint_txn" / JOB
    assert not staging.exists() or list(staging.iterdir()) == [], \
        "merged and refused batches leave nothing staged"
