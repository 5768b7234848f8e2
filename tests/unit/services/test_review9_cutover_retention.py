"""Review (issue 49, wt-keepsp): savepoint history retention while a cutover is open.

`cutover_savepoints` keeps, while an open cutover has nothing agreed, *every* savepoint
of blue's generation of a batch from the warm-up on ("blue may have stopped before the
agreement was written"). Blue runs on untouched until the orchestrator files its
``stop_after`` request: a cutover whose orchestrator is gone (its task failed for good,
nobody called it off) keeps each scheduled savepoint blue takes from then on, forever,
although no stop_after request exists that could make one of them S. The request is a
record retention can read (listing, then cutover records, then requests: a request filed
after that read makes an S written after the listing, which retention never sees).
A real store (memory), the records a real blue and orchestrator write.
"""

from __future__ import annotations

import uuid

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
from airflow_sparkpoint.services.rollback import abort_generation
from tests.support.cutover_records import CID, N, cutover_plan
from tests.support.records import put_checkpoint


def test_an_open_cutover_without_a_stop_request_keeps_no_scheduled_savepoint_of_blue(
    catalog: Catalog
) -> None:
    catalog.claim_generation()  # blue, generation 1
    warmup = put_checkpoint(catalog, batch_id=N, generation=1)
    CutoverStore(catalog).plan(cutover_plan(warmup_uri=catalog.checkpoint_uri(warmup.id), warmup_batch=N))
    # The orchestrator is gone before filing blue's stop_after request; blue runs on and
    # its scheduled savepoints (max_count=1) go on.
    scheduled = []
    for batch in range(N + 1, N + 6):
        meta = put_checkpoint(catalog, batch_id=batch, generation=1)
        scheduled.append(catalog.create_savepoint(catalog.handle(meta), generation=1).uri)
    assert CutoverStore(catalog).read(CID).open and CutoverStore(catalog).read(CID).agreed is None
    assert all(e.metadata is not None and e.metadata.generation == 1 for e in catalog.list_savepoints())

    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)

    # Oracle: no stop_after request names the cutover, so none of them is blue's final
    # savepoint; only the newest stays.
    assert sorted(disposed) == sorted(scheduled[:-1])


def test_blue_s_final_savepoint_is_history_once_green_committed_past_n(catalog: Catalog) -> None:
    """`_blue_savepoint_origin` returns to S only while green's sinks hold nothing past N;
    once green committed N+1 a rollback returns to green's own checkpoint. Retention keeps
    S regardless, for the whole life of green's generation (a streaming job: months)."""
    from airflow_sparkpoint.checkpoints.generations import Fence
    from airflow_sparkpoint.sinks.transactions import settle_all
    from tests.support.cutover_records import blue_stopped, green_took_over
    from tests.support.fake_sinks import FakeSink

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    s = blue_stopped(catalog, sink)
    green, _newer = green_took_over(catalog, sink)
    staged = next(r for r in catalog.transactions() if r.generation == green and r.batch_id == N + 1)
    # green's commit step published N+1 and settled its record (the transaction service
    # every committer goes through: the commit, the job's commit head, the record's deletion)
    settle_all(catalog, [staged], lambda _r: sink, confirmed=True, fence=Fence(catalog, green))
    assert not catalog.transactions()
    assert sink.committed_position("orders") == N + 1

    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)

    assert s in disposed, "S kept although no rollback of green returns there"
    abort_generation(catalog, green)  # the rule the oracle rests on: green's own checkpoint
    origin = catalog.origins()[-1]
    assert origin.kind == "checkpoint" and origin.uri != s


def test_an_unreadable_old_cutover_record_does_not_stop_history_retention(catalog: Catalog) -> None:
    """Fail closed would be: count the unreadable cutover as open (what `open_cutover`
    says of it) and keep what an open one keeps (its blue generation's savepoints from the
    warm-up on); every other savepoint is still judged. Today `cutover_savepoints`
    raises, `keep_savepoint_history` logs it after every savepoint, and nothing is ever
    disposed again (unbounded) until someone repairs the record by hand."""
    from airflow_sparkpoint.checkpoints import layout
    from airflow_sparkpoint.services.cutover import call_off

    catalog.claim_generation()
    warmup = put_checkpoint(catalog, batch_id=0, generation=1)
    CutoverStore(catalog).plan(cutover_plan(warmup_uri=catalog.checkpoint_uri(warmup.id)))
    call_off(catalog, CID, reason="test", by="test")
    catalog.store.put(layout.cutover_key(CID, "done"), b"{not json")  # a torn / corrupted end record
    catalog.claim_generation()  # a later deploy (generation 2) runs and takes savepoints
    taken = []
    for batch in range(1, 5):
        meta = put_checkpoint(catalog, batch_id=batch, generation=2)
        taken.append(catalog.create_savepoint(catalog.handle(meta), generation=2).uri)

    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)

    assert sorted(disposed) == sorted(taken[:-1])  # generation 2's: no cutover names them
