"""The coordinator keeps the lifetime checkpoint counters of the history model where the
events happen: a completed checkpoint, a failed one, a restore."""

from __future__ import annotations

import uuid
from pathlib import Path

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.counters import read_counters
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import checkpointer
from tests.support.fake_sinks import RecordingSink
from tests.support.live_dirs import write_live


def test_completed_failed_and_restored_are_counted_across_generations(tmp_path: Path) -> None:
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    coord = checkpointer(catalog, tmp_path, RecordingSink(), generation, tolerable_failures=5)
    for batch in range(2):
        write_live(tmp_path, batch)
        assert coord.checkpoint(batch) is not None
    original = catalog.store.upload_file

    def vanish(local_path: str, key: str) -> None:
        raise FileNotFoundError(local_path)

    write_live(tmp_path, 2)
    catalog.store.upload_file = vanish  # type: ignore[method-assign]
    assert coord.checkpoint(2) is None  # a tolerated failure
    catalog.store.upload_file = original  # type: ignore[method-assign]
    counters = read_counters(catalog)
    assert counters is not None and (counters.completed, counters.failed, counters.restored) == (2, 1, 0)
    assert [ok for _, ok in counters.recent] == [True, True, False]

    # The next run restores the latest checkpoint and completes one more.
    latest = catalog.latest()
    nxt = checkpointer(catalog, tmp_path, RecordingSink(), catalog.claim_generation().generation)
    nxt.seed(latest, {})
    nxt.transactions.seed(latest)
    assert nxt.checkpoint(2) is not None
    counters = read_counters(catalog)
    assert counters is not None and (counters.completed, counters.failed, counters.restored) == (3, 1, 1)
    assert counters.generation == 2
