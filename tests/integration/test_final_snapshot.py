"""A drained job's last checkpoint carries the RocksDB snapshot Spark uploads after the
last commit (its background maintenance), so the next run loads that snapshot instead of
replaying the changelogs since the previous one (docs/BENCHMARKS.md: restore at scale).

Real ``spark-submit`` runs of per-user running totals. With ``minDeltasForSnapshot=2``
and four batches (state versions 1-4), Spark creates the snapshot of version 4 at the last
commit and uploads it only at its next maintenance tick, after the job's last checkpoint:
that is the window the test needs, and it asserts the window was there (the checkpoint of
batch 3 taken first lacks the snapshot)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.storage import open_storage
from tests.support.rescale_runs import JOB, expected, finished, submit, table, write_inputs

# slow: the default run is at its 40-minute budget; `make test-all` runs it
pytestmark = [pytest.mark.spark, pytest.mark.slow]

CONF = {
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
    "spark.sql.shuffle.partitions": "2",
    "spark.sparkpoint.checkpoint.finalSnapshot.minReplay": "0",
}
ATTEMPTS = 3


def _store_dirs(files: list[str]) -> set[str]:
    return {path.rpartition("/")[0] for path in files if path.startswith("state/")
            and path.endswith(".changelog")}


def test_the_last_checkpoint_of_a_drained_job_holds_the_state_snapshot(tmp_path: Path) -> None:
    # A maintenance tick of Spark's between the last commit and the job's checkpoint of it
    # (a window of well under a second in 10 s) uploads the snapshot early: then there is
    # nothing to wait for, the attempt proves nothing and another one runs.
    for attempt in range(ATTEMPTS):
        base = tmp_path / f"attempt-{attempt}"
        write_inputs(base / "input", 0, 4)
        first = finished(submit(base, "aggregation", CONF))
        assert first["last_batch"] == 3
        assert table(base / "out") == expected(4)
        catalog = Catalog(open_storage(str(base / "sp")), JOB)
        checkpoints = catalog.checkpoints()
        of_last_batch = sorted((m for m in checkpoints if m.batch_id == 3), key=lambda m: m.id)
        stores = _store_dirs([f.path for f in of_last_batch[-1].files])
        assert len(stores) == 2, stores
        # Whatever happened, the latest checkpoint holds the snapshot of version 4 of every store.
        assert livedir.newest_snapshots(f.path for f in of_last_batch[-1].files) == dict.fromkeys(stores, 4)
        if all(livedir.newest_snapshots(f.path for f in of_last_batch[0].files).get(d, 0) == 4
               for d in stores):
            assert len(of_last_batch) == 1, "a second checkpoint although the first held the snapshots"
            continue  # the window closed by itself: try again
        break
    else:
        pytest.fail(f"in {ATTEMPTS} attempts Spark's maintenance always uploaded the snapshot before the "
                    "job's checkpoint: the wait was never exercised")
    # The window was there: the checkpoint taken when the query drained lacks the snapshot
    # of version 4, the one taken after the wait holds it and is the latest.
    assert len(of_last_batch) == 2, [(m.id, m.batch_id) for m in checkpoints]
    before, after = of_last_batch
    assert catalog.latest().id == after.id
    assert after.stats.files_copied > 0 and all(
        f.path.endswith(".zip") or "/SSTs/" in f.path
        for f in after.files if f.path not in {g.path for g in before.files}
    )

    # The next run restores from it (the live location is gone, so from the retained
    # files, not in place): exact totals over all six files.
    shutil.rmtree(base / "sp" / JOB / "live")
    write_inputs(base / "input", 4, 6)
    second = finished(submit(base, "aggregation", CONF))
    assert second["restored_from"] == catalog.checkpoint_uri(after.id)
    assert second["restore_mode"] == "snapshot" and second["last_batch"] == 5
    assert table(base / "out") == expected(6)
