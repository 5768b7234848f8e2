"""Review (issue 47, 8736a54): `abort_generation` now deletes the record of a
transaction it finished (settle_all). The readers that saw the kept record before — the
restart's sink-lineage check and recovery of the start after the rollback, whose restart
point lists the finished transaction as pending (external commit mode) — must read the
sink instead: no refusal, and the finished batch is neither lost nor published twice.
A real directory sink, real records in a memory store."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.runtime.recovery import recover_transactions
from airflow_sparkpoint.runtime.restore import plan_restore
from airflow_sparkpoint.runtime.sink_lineage import divergence
from airflow_sparkpoint.services.rollback import abort_generation
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import run_config
from tests.support.deaths import Died, kill_at
from tests.support.records import checkpoint_at
from tests.support.sink_files import staged_transaction, visible_rows

JOB = "job"


def test_the_start_after_a_rollback_that_finished_a_confirmed_batch_reads_it_from_the_sink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = Catalog(MemoryStorage(f"r9-{uuid.uuid4().hex[:8]}"), JOB)
    sink = DirectorySink(str(tmp_path / "out"), "json")
    g = catalog.claim_generation().generation
    catalog.write_origin(new_origin(g, kind="empty", uri=None, base_id=-1, snapshot_id=None, batch_id=None,
                                    id_floor=catalog.next_checkpoint_id() - 1, restore={}, live_dir=None,
                                    host="h", pid=1))
    t0, t1 = staged_transaction(sink, 0, g, job=JOB), staged_transaction(sink, 1, g, job=JOB)
    catalog.put_transaction(t0)
    checkpoint_at(catalog, 0, generation=g, pending=[t0])
    catalog.put_transaction(t1)
    checkpoint_at(catalog, 1, generation=g, pending=[t0, t1])

    with monkeypatch.context() as patch:  # the commit step decided batch 0 and died promoting it
        kill_at(patch, "promoting")
        with pytest.raises(Died):
            sink.commit(t0)
    assert sink.decision(t0) == "promote"  # decided; its promotion died halfway

    assert abort_generation(catalog, g) == [t1.txn_id]
    assert catalog.transactions() == []  # the finished record went too (8736a54)
    assert sink.is_committed(t0) and not sink.is_committed(t1)

    # restore=latest: the rollback's origin is g's checkpoint of batch 0, which lists t0 pending.
    start = catalog.claim_generation().generation
    plan = plan_restore(run_config(), catalog, None)
    assert plan.snapshot is not None and plan.batch_id == 0
    assert [t.txn_id for t in plan.snapshot.metadata.transactions] == [t0.txn_id]
    assert divergence(plan.snapshot, sink, catalog, JOB, own_root=True) is None
    pending, summary = recover_transactions(catalog, sink, plan, "external", start)
    assert pending == [] and summary["committed"] == [] and summary["aborted"] == []
    assert [r["id"] for r in visible_rows(sink, order_by="id")] == [0], "batch 0 once, batch 1 never"
