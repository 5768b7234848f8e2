"""Storage requests per checkpoint stay the same however old the job is and however many
checkpoints are retained (issue 32): counted by a `CountingStorage`, not timed.

A fake clock advances 5 s per batch (a processingTime trigger of a few seconds), and the
live location is cleaned like Spark's maintenance does, so every checkpoint deletes one
old checkpoint, journals and deletes the shared files nobody references any more.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.storage import MemoryStorage
from airflow_sparkpoint.storage.counting import CountingStorage
from tests.support.checkpointers import checkpointer, commit
from tests.support.fake_sinks import RecordingSink, recording_record
from tests.support.live_dirs import write_live

BATCH_SECONDS = 5.0


def _spark_cleanup(live: Path, batch: int) -> None:
    """What Spark's maintenance removes after batch `batch` (old logs and state versions)."""
    for old in (live / "offsets" / str(batch - 3), live / "commits" / str(batch - 3),
                live / "state" / "0" / "0" / f"{batch - 2}.changelog"):
        old.unlink(missing_ok=True)


class EmptyFoldersStay(MemoryStorage):
    """Lists a "directory" after its last object went, like SeaweedFS's S3 gateway does."""

    def __init__(self) -> None:
        super().__init__(uuid.uuid4().hex)
        self.seen: dict[str, set[str]] = {}

    def list_dirs(self, prefix: str = "") -> list[str]:
        names = self.seen.setdefault(prefix, set())
        names.update(super().list_dirs(prefix))
        return sorted(names)


def run_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, num_retained: int, batches: int,
                    inner: MemoryStorage | None = None, timeout_s: float = 10,
                    index_sizes: list[int] | None = None,
                    ) -> tuple[list[Counter[str]], list[list[tuple[str, str]]], Catalog]:
    """Checkpoint and commit `batches` batches; the requests of each cycle by kind and in
    order (and into `index_sizes`, the coordinator's file index after each)."""
    real = time.time
    offset = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])
    store = CountingStorage(inner or MemoryStorage(uuid.uuid4().hex))
    catalog = Catalog(store, "job")
    generation = catalog.claim_generation().generation
    catalog.write_origin(new_origin(generation, kind="empty", uri=None, base_id=-1, snapshot_id=None,
                                    batch_id=None, id_floor=0, restore={}, live_dir=None, host="h", pid=1))
    live = tmp_path / f"live-{num_retained}"
    coord = checkpointer(catalog, live, RecordingSink(), generation, num_retained=num_retained,
                         timeout_s=timeout_s)
    kinds, logs = [], []
    for batch in range(batches):
        write_live(live, batch)
        _spark_cleanup(live, batch)
        coord.transactions.add_pending(recording_record(batch, generation))
        offset[0] += BATCH_SECONDS
        store.reset()
        assert coord.checkpoint(batch) is not None
        assert commit(coord) == [batch]
        kinds.append(store.kinds)
        logs.append(list(store.log))
        if index_sizes is not None:
            index_sizes.append(len(coord.index))
    return kinds, logs, catalog


def test_requests_per_checkpoint_do_not_grow_with_the_jobs_age(tmp_path, monkeypatch):
    kinds, logs, catalog = run_checkpoints(tmp_path, monkeypatch, num_retained=3, batches=51)

    # Retention really worked on every cycle: old checkpoints deleted, orphans journaled.
    assert len(catalog.checkpoint_ids()) == 3
    assert sum(1 for op, key in logs[50] if op == "put" and key.startswith(f"job/{layout.GC}/")) == 1
    assert any(op == "delete" and "/shared/" in key for op, key in logs[50])
    assert kinds[50] == kinds[5], (kinds[5], kinds[50], logs[50])


def test_requests_per_checkpoint_do_not_grow_with_the_number_retained(tmp_path, monkeypatch):
    few, _, _ = run_checkpoints(tmp_path, monkeypatch, num_retained=3, batches=31)
    many, logs, catalog = run_checkpoints(tmp_path, monkeypatch, num_retained=20, batches=31)

    assert len(catalog.checkpoint_ids()) == 20
    assert many[30] == few[30], (few[30], many[30], logs[30])


def test_requests_per_checkpoint_do_not_grow_when_deleted_checkpoints_stay_listed(tmp_path, monkeypatch):
    """SeaweedFS keeps listing a deleted checkpoint's empty directory (seen in the soak):
    each pass must not read, list and delete every checkpoint ever deleted again."""
    kinds, logs, catalog = run_checkpoints(tmp_path, monkeypatch, num_retained=3, batches=51,
                                           inner=EmptyFoldersStay())

    assert len(catalog.checkpoint_ids()) == 51  # the store lists them all
    assert [m.id for m in catalog.checkpoints()] == [51, 50, 49]
    assert kinds[50] == kinds[5], (kinds[5], kinds[50], logs[50])


def test_orphans_are_collected_once_per_tenth_of_the_grace_period_not_at_every_checkpoint(
    tmp_path, monkeypatch
):
    """Each collection writes a deletion-journal entry, and every checkpoint lists the
    journal until entries are an hour old: collected at every checkpoint (every 3 s in the
    soak), the journal grew to 1,200 entries listed per checkpoint. With a grace period of
    100 s (the checkpoint timeout) and a batch every 5 s: once per 10 s, every 2nd batch."""
    _kinds, logs, catalog = run_checkpoints(tmp_path, monkeypatch, num_retained=3, batches=61, timeout_s=100)

    def journal_puts(log: list[tuple[str, str]]) -> int:
        return sum(1 for op, key in log if op == "put" and key.startswith(f"job/{layout.GC}/"))

    def shared_deletes(log: list[tuple[str, str]]) -> int:
        return sum(1 for op, key in log if op == "delete" and "/shared/" in key)

    late = logs[30:]  # orphans exist once files are older than the 100 s grace (20 batches)
    assert all(journal_puts(log) <= 1 for log in logs)
    assert sum(shared_deletes(log) for log in late) > 0, "orphans are still collected"
    collecting = [i for i, log in enumerate(logs) if journal_puts(log)]
    assert collecting and all(b - a >= 2 for a, b in itertools.pairwise(collecting)), collecting
    assert sum(journal_puts(log) for log in late) <= 16, collecting
    assert len(list(catalog.store.list(layout.GC))) == len(collecting)


def test_the_coordinators_file_index_forgets_what_spark_deleted(tmp_path, monkeypatch):
    """The index of live files (size, mtime, stored copy) kept an entry for every file
    Spark ever wrote: ≈ 700 bytes for each of ≈ 6 files a batch, 120 MB a day at a 3 s
    trigger. It holds what the live location holds."""
    sizes: list[int] = []
    run_checkpoints(tmp_path, monkeypatch, num_retained=3, batches=41, index_sizes=sizes)

    live = tmp_path / "live-3"
    on_disk = sum(1 for p in live.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert sizes[40] == sizes[10] <= on_disk, sizes
