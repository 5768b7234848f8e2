"""A retry's restore choice (`services.retry.choose_restore`) while another run's lineage
stands at a savepoint (found in review of 4e6525e, where `Catalog.latest()` answered None
there; the test failed on that code)."""

from __future__ import annotations

import uuid

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.services.retry import choose_restore
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.records import put_checkpoint


def _origin(catalog: Catalog, generation: int, *, kind: str, uri: str | None, base: int) -> None:
    catalog.write_origin(new_origin(generation, kind=kind, uri=uri, base_id=base, snapshot_id=None,
                                    batch_id=None,
                                    id_floor=catalog.next_checkpoint_id() - 1, restore={}, live_dir=None,
                                    host="h", pid=generation))


def test_a_retry_resumes_its_own_newest_checkpoint_while_another_runs_savepoint_lineage_has_none() -> None:
    """The window: a task restores savepoint P by path (``restore=<P>``). Its try 1
    (generation 2) checkpoints batches 1 and 2 (chk-3, chk-4) and dies. Before the retry,
    another run (generation 3: a deploy, a restore by hand) restores savepoint Q by path
    and dies before its first checkpoint: the newest lineage stands at Q, so ``latest()``
    is None. `choose_restore` then answers P again ("no try of this task completed a
    checkpoint yet"), although try 1 did: the retry restarts from batch 0 and finds the
    sink holding try 1's batches 1 and 2 (refused, ``SinkAheadError``; or rewound and
    redone). Its contract: "the newest checkpoint that one of the task's tries completed".
    Before 4e6525e ``latest()`` answered chk-1 (P's source, not superseded) and the retry
    restored chk-4 by path.
    """
    mem = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    first = mem.claim_generation().generation
    _origin(mem, first, kind="empty", uri=None, base=-1)
    one = put_checkpoint(mem, batch_id=0)
    two = put_checkpoint(mem, batch_id=1)
    task_savepoint = mem.create_savepoint(mem.handle(one))
    other_savepoint = mem.create_savepoint(mem.handle(two))

    try_one = mem.claim_generation().generation  # restores P by path (base: P's source, chk-1)
    _origin(mem, try_one, kind="savepoint", uri=task_savepoint.uri, base=one.id)
    put_checkpoint(mem, batch_id=1)
    own = put_checkpoint(mem, batch_id=2)
    assert own.generation == try_one

    other = mem.claim_generation().generation  # restores Q by path, dies before its first checkpoint
    _origin(mem, other, kind="savepoint", uri=other_savepoint.uri, base=two.id)

    chosen = choose_restore(2, restore=task_savepoint.uri, catalog=mem, own_generations=[try_one])
    assert chosen == mem.checkpoint_uri(own.id), (
        f"try 2 restores {chosen}, not chk-{own.id}, the newest checkpoint try 1 (generation "
        f"{try_one}) completed")
