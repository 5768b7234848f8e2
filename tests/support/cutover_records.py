"""The records a cutover's blue and green write around blue's final savepoint S (issue 49),
in a real catalog: blue (generation 1) stopped at N with its final checkpoint X and S, and
green's claim, adoption and first checkpoints. Shared by the tests of savepoint history
retention and the rollback of green; and the one builder of a cutover plan (`cutover_plan`)."""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverStore
from airflow_sparkpoint.runtime.cutover import adopt
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint, transaction_record

__all__ = ["CID", "N", "blue_stopped", "cutover_plan", "green_took_over"]

CID = "1764370000000-0123abcd"
N = 3


def cutover_plan(cid: str = CID, **fields: Any) -> CutoverPlan:
    """The plan of cutover `cid`: generation 1 of job ``orders`` hands over to the shadow
    job ``orders-shadow`` in ``memory://shadow``, warming up from ``memory://x/orders/chk-1``
    (batch 0); `fields` (`CutoverPlan`'s, ``id`` too) replace any of these.

    :raises ConfigError: a field is invalid (`CutoverPlan`'s checks).
    """
    values: dict[str, Any] = {"id": cid, "job": "orders", "blue_generation": 1,
                              "warmup_uri": "memory://x/orders/chk-1", "warmup_batch": 0,
                              "green_job": "orders-shadow", "green_root": "memory://shadow"}
    return CutoverPlan(**{**values, **fields})


def blue_stopped(catalog: Catalog, sink: FakeSink) -> str:
    """Blue (generation 1) committed batches 0..N, took its final checkpoint X of N and
    its final savepoint S (a copy of X, with N's transaction as a stop-with-savepoint
    records it), and completed the cutover's stop_after request naming both. Returns S's URI."""
    catalog.claim_generation()
    for batch in range(N + 1):
        sink.world["committed"][batch] = f"orders-b{batch}-g1"
    final = put_checkpoint(catalog, batch_id=N, generation=1)
    x = catalog.checkpoint_uri(final.id)
    store = CutoverStore(catalog)
    store.plan(cutover_plan(warmup_uri=x, warmup_batch=N))
    channel = ControlChannel(catalog)
    request = channel.submit("stop_after", generation=1, after_batch=N, cutover=CID)
    store.agree(CID, N, request.id)
    channel.acknowledge(request, 1)
    committed = transaction_record(sink, N, 1, job="orders", created_at=0.0)
    saved = catalog.create_savepoint(catalog.handle(final.with_(transactions=(committed,))), generation=1)
    channel.complete(request, generation=1, batch_id=N, checkpoint=x, savepoint=saved.uri)
    return saved.uri


def green_took_over(catalog: Catalog, sink: FakeSink) -> tuple[int, list[str]]:
    """Green claims the cutover, checkpoints N (its adoption) and N+1, N+2, stages N+1
    (external commit mode: nothing committed past N) and takes a savepoint of each of its
    two newer checkpoints. Returns green's generation and its savepoints' URIs, oldest first."""
    green = adopt(catalog, sink, CID, live_dir=None).generation
    put_checkpoint(catalog, batch_id=N, generation=green)
    newer = []
    for batch in (N + 1, N + 2):
        meta = put_checkpoint(catalog, batch_id=batch, generation=green)
        newer.append(catalog.create_savepoint(catalog.handle(meta), generation=green).uri)
    catalog.put_transaction(transaction_record(sink, N + 1, green, job="orders", created_at=0.0))
    return green, newer
