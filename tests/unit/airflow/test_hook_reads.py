"""What `SparkpointHook`'s reads of a job's output return (docs/reference/hook.md):
`pending_transactions`, `staged_rows` (a write-audit-publish audit) and `delta_rows`,
on a local Delta table staged without Spark. Pinned before the reads moved into
services/sinks.py (issue 47), so the hook keeps answering the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks import DeltaSink, DirectorySink
from airflow_sparkpoint.storage import open_storage
from tests.support.delta_staging import JOB, staged
from tests.support.records import transaction_record

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def test_the_hook_reads_pending_transactions_their_staged_rows_and_the_published_table(
    tmp_path: Path
) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    root, table = tmp_path / "checkpoints", str(tmp_path / "table")
    catalog = Catalog(open_storage(str(root)), JOB)
    sink = DeltaSink(table)
    sink.commit(staged(sink, 0, 1, [("a", 1), ("b", 2)]))  # published, never recorded here
    first, second = staged(sink, 1, 1, [("c", 3)]), staged(sink, 2, 2, [("d", 4), ("e", 5)])
    for record in (second, first):
        catalog.put_transaction(record)
    hook = SparkpointHook(None, storage_uri=str(root))

    assert [(r.batch_id, r.generation) for r in hook.pending_transactions(JOB)] == [(1, 1), (2, 2)]
    assert [r.txn_id for r in hook.pending_transactions(JOB, generation=2)] == [second.txn_id]
    assert hook.pending_transactions(JOB, generation=3) == []
    assert hook.staged_rows(JOB) == [{"user": "c", "total": 3}, {"user": "d", "total": 4},
                                     {"user": "e", "total": 5}]
    assert hook.staged_rows(JOB, generation=1) == [{"user": "c", "total": 3}]
    assert sorted(hook.delta_rows(table), key=lambda r: r["user"]) == [{"user": "a", "total": 1},
                                                                       {"user": "b", "total": 2}]
    assert sorted(r["user"] for r in hook.delta_rows(table, columns=["user"])) == ["a", "b"]
    assert hook.delta_rows(table, columns=["user"])[0].keys() == {"user"}
    assert hook.delta_rows(str(tmp_path / "no-table")) == []


def test_staged_rows_of_a_sink_other_than_delta_are_refused(tmp_path: Path) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    root = tmp_path / "checkpoints"
    record = transaction_record(DirectorySink(str(tmp_path / "out")), 4, 1, {"files": []}, job=JOB)
    Catalog(open_storage(str(root)), JOB).put_transaction(record)
    hook = SparkpointHook(None, storage_uri=str(root))

    assert hook.pending_transactions(JOB) == [record]
    with pytest.raises(ConfigError, match=rf"transaction {record.txn_id} \(directory sink\) cannot be read"):
        hook.staged_rows(JOB)
