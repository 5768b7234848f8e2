"""The final-snapshot checkpoint without Spark: a hand-made RocksDB live location in which
a thread plays Spark's maintenance, uploading the snapshot after the last checkpoint."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.storage import MemoryStorage
from tests.unit.runtime.test_coordinator import RecordingSink, coordinator, write_live


def _write(root: Path, rel: str, size: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_pending_snapshots_are_stores_min_deltas_past_their_last_snapshot(tmp_path):
    for version in range(1, 5):
        _write(tmp_path, f"state/0/0/{version}.changelog", 100 * version)
        _write(tmp_path, f"state/0/1/{version}.changelog", 10)
    _write(tmp_path, "state/0/0/2.zip", 7)
    _write(tmp_path, "state/0/1/4_0f3c2b1e-1111-2222-3333-444455556666.zip", 7)  # checkpoint format v2
    _write(tmp_path, "state/0/0/SSTs/000012-abc.sst", 50)
    _write(tmp_path, "state/0/_metadata/metadata", 5)
    _write(tmp_path, "state/0/0/5.changelog", 999)  # batch 4's: past the restart point after batch 3

    stores = {s.dir: s for s in livedir.state_stores(str(tmp_path), 3)}
    assert set(stores) == {"state/0/0", "state/0/1"}
    assert (stores["state/0/0"].latest, stores["state/0/0"].snapshot) == (4, 2)
    assert stores["state/0/0"].replay_bytes == 300 + 400  # changelogs 3 and 4, after snapshot 2
    assert (stores["state/0/1"].snapshot, stores["state/0/1"].replay_bytes) == (4, 0)
    assert [s.dir for s in livedir.pending_snapshots(str(tmp_path), 3, 2)] == ["state/0/0"]
    assert livedir.pending_snapshots(str(tmp_path), 3, 3) == []
    assert livedir.newest_snapshots(["state/0/0/2.zip", "state/0/0/10.zip", "state/0/0/3.changelog",
                                     "offsets/4"]) == {"state/0/0": 10}


def _four_batches(tmp_path: Path) -> tuple[Catalog, object, Path]:
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    generation = catalog.claim_generation().generation
    live = tmp_path / "live"
    coord = coordinator(catalog, live, RecordingSink(), generation)
    for batch in range(4):  # state versions 1..4, changelogs only
        write_live(live, batch)
    assert coord.checkpoint(3) is not None
    return catalog, coord, live


def test_the_snapshot_uploaded_after_the_last_checkpoint_gets_a_checkpoint_of_its_own(tmp_path):
    catalog, coord, live = _four_batches(tmp_path)
    first = coord.last_checkpoint

    def maintenance() -> None:  # Spark's background upload, after the job's last checkpoint
        time.sleep(0.6)
        _write(live, "state/0/0/SSTs/000007-9d1c.sst", 64)
        _write(live, "state/0/0/4.zip", 32)

    uploader = threading.Thread(target=maintenance)
    started = time.monotonic()
    uploader.start()
    meta = coord.checkpoint_final_snapshot(min_deltas=2, timeout_s=30, min_replay=0, cancelled=lambda: False)
    waited = time.monotonic() - started
    uploader.join()

    assert meta is not None and meta.batch_id == first.batch_id == 3 and meta.id > first.id
    assert waited >= 0.6  # it did wait for the upload
    paths = {f.path for f in meta.files}
    assert {"state/0/0/4.zip", "state/0/0/SSTs/000007-9d1c.sst"} <= paths
    assert "state/0/0/4.zip" not in {f.path for f in first.files}
    assert meta.stats.files_copied == 2  # only the snapshot's files were new
    assert catalog.latest().id == meta.id


def test_no_wait_when_the_replay_is_small_or_nothing_is_pending(tmp_path):
    catalog, coord, live = _four_batches(tmp_path)
    latest = catalog.latest().id
    replay = sum(s.replay_bytes for s in livedir.pending_snapshots(str(live), 3, 2))
    started = time.monotonic()
    assert coord.checkpoint_final_snapshot(min_deltas=2, timeout_s=30, min_replay=replay + 1,
                                           cancelled=lambda: False) is None
    assert coord.checkpoint_final_snapshot(min_deltas=5, timeout_s=30, min_replay=0, cancelled=lambda: False) is None
    assert coord.checkpoint_final_snapshot(min_deltas=2, timeout_s=0, min_replay=0, cancelled=lambda: False) is None
    assert time.monotonic() - started < 5 and catalog.latest().id == latest


def test_the_wait_is_bounded_and_ends_on_cancel(tmp_path):
    catalog, coord, _live = _four_batches(tmp_path)
    latest = catalog.latest().id
    started = time.monotonic()
    assert coord.checkpoint_final_snapshot(min_deltas=2, timeout_s=0.8, min_replay=0, cancelled=lambda: False) is None
    assert 0.8 <= time.monotonic() - started < 10
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    assert coord.checkpoint_final_snapshot(min_deltas=2, timeout_s=60, min_replay=0, cancelled=cancel.is_set) is None
    assert time.monotonic() - started < 10 and catalog.latest().id == latest
