"""What a restart needs from Spark's live checkpoint location, and path rewriting."""

from __future__ import annotations

import os

import pytest

from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.materialize import _path_forms, _rewrite_paths
from airflow_sparkpoint.storage.localfs import Dir


@pytest.mark.parametrize(
    ("path", "batch", "needed"),
    [
        ("metadata", 3, True),
        ("offsets/3", 3, True),
        ("offsets/4", 3, False),  # planned, not committed: re-planned after restore
        ("commits/3", 3, True),
        ("commits/4", 3, False),
        ("sources/0/3", 3, True),
        ("sources/0/9.compact", 3, False),
        ("sources/0/9.compact", 9, True),
        ("state/0/1/4.changelog", 3, True),  # state after batch 3 is version 4
        ("state/0/1/5.changelog", 3, False),
        ("state/0/1/4.zip", 3, True),
        ("state/0/1/5_8c1f7d9e-7a2b-4a1e-9c1e-1a2b3c4d5e6f.zip", 3, False),
        ("state/0/1/4.delta", 3, True),
        ("state/0/1/4.snapshot", 3, True),
        ("state/0/1/SSTs/000008-abc.sst", 3, True),
        ("state/0/_metadata/schema", 3, True),
        ("state/0/_metadata/v2/3", 3, True),
        ("state/0/_metadata/v2/4", 3, False),
    ],
)
def test_needed_for_restart(path, batch, needed):
    assert livedir.needed_for_restart(path, batch) is needed


def test_walk_skips_checksums_and_temp_files(tmp_path):
    for name in ("commits/0", "commits/.0.crc", "offsets/0", "offsets/.0.tmp", "state/0/0/1.changelog"):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")
    assert (sorted(f.path for f in livedir.walk(str(tmp_path)))
            == ["commits/0", "offsets/0", "state/0/0/1.changelog"])
    assert livedir.last_commit(str(tmp_path)) == 0
    assert livedir.last_commit(str(tmp_path / "nowhere")) is None


def test_local_path_of():
    assert livedir.local_path_of("file:///a/b") == "/a/b"
    assert livedir.local_path_of("file:/a/b") == "/a/b"
    assert livedir.local_path_of("/a/b") == "/a/b"
    assert livedir.local_path_of("s3a://bucket/x") is None


def test_rewrite_paths_replaces_every_form_once(tmp_path):
    # g1 is a prefix of g10: a naive sequence of replaces would produce g100.
    target = tmp_path / "meta"
    target.write_bytes(b'{"a":"file:/work/live/g1/state/x","b":"file:///work/live/g1/y","c":"/work/live/g1/z"}')
    root = Dir.open(str(tmp_path))
    assert _rewrite_paths(root, "meta", _path_forms("/work/live/g1"), "/work/live/g10")
    assert target.read_bytes() == (
        b'{"a":"file:/work/live/g10/state/x","b":"file:///work/live/g10/y","c":"/work/live/g10/z"}'
    )
    other = tmp_path / "other"
    other.write_bytes(b"no paths here")
    assert not _rewrite_paths(root, "other", _path_forms("/work/live/g1"), "/x")
    root.close()
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path))  # no temp files left behind
    assert not [n for n in os.listdir(tmp_path) if "tmp" in n]


PATHS = [
    "metadata", "offsets/5", "commits/5", "state/0/_metadata/schema",
    # RocksDB with changelogs: snapshots 2 and 4, restart version 6
    *(f"state/0/0/{v}.changelog" for v in range(1, 7)), "state/0/0/2.zip", "state/0/0/4.zip",
    "state/0/0/SSTs/000008-a.sst",
    # one snapshot at or below the restart version; 7.zip (an in-flight batch's) is not loaded
    *(f"state/0/1/{v}.changelog" for v in range(1, 7)), "state/0/1/3.zip", "state/0/1/7.zip",
    # RocksDB without changelogs (a snapshot at every commit): nothing to replay, no fallback
    *(f"state/1/0/{v}.zip" for v in range(1, 7)),
    # HDFS provider: deltas and a snapshot; kept whole (its cleanup needs its oldest kept version)
    *(f"state/2/0/{v}.delta" for v in range(1, 7)), "state/2/0/4.snapshot",
    # checkpoint format v2: the commit log's lineage picks the files, kept whole
    "state/3/0/1_0a1b.changelog", "state/3/0/2_0a1b.zip", "state/3/0/3_0a1b.changelog",
]


def test_a_restart_reads_each_stores_newest_snapshot_and_the_versions_after_it():
    """Spark loads the newest snapshot at or below the restart version (batch + 1) and
    replays the changelogs after it: the versions before it are never read."""
    assert livedir.unread_at_restart(PATHS, batch_id=5, repair=False) == {
        "state/0/0/1.changelog", "state/0/0/2.changelog", "state/0/0/2.zip", "state/0/0/3.changelog",
        "state/0/1/1.changelog", "state/0/1/2.changelog",
        *(f"state/1/0/{v}.zip" for v in range(1, 6)),
    }
    # at batch 1 (version 2) no snapshot of state/0/1 is at or below it: read whole
    assert (not {p for p in livedir.unread_at_restart(PATHS, batch_id=1, repair=False)
                 if p.startswith("state/0/1/")})


def test_with_snapshot_repair_a_restart_keeps_what_the_fallback_snapshot_needs():
    """Spark 4.1+ loads an older snapshot (and replays more) when the newest fails to load:
    a store with changelogs keeps everything from its second-newest snapshot, or all of it."""
    assert livedir.unread_at_restart(PATHS, batch_id=5, repair=True) == {
        "state/0/0/1.changelog", *(f"state/1/0/{v}.zip" for v in range(1, 6))}


def test_snapshot_repair_is_on_from_spark_4_1_unless_turned_off():
    from airflow_sparkpoint.runtime.spark_support import snapshot_repair

    assert not snapshot_repair("3.5.3", None) and not snapshot_repair("4.0.1", "true")
    assert snapshot_repair("4.1.0", None) and snapshot_repair("4.2.0", " True ")
    assert not snapshot_repair("4.2.0", "false")


def test_materialize_for_a_restore_leaves_the_unread_versions_in_the_snapshot(tmp_path):
    """A restore downloads what Spark loads (`only_read`): a long-running job's snapshot
    holds up to ~100 versions of changelogs before its newest RocksDB snapshot."""
    import uuid

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.runtime.restore import materialize
    from airflow_sparkpoint.storage import MemoryStorage
    from tests.support.checkpointers import checkpointer
    from tests.support.fake_sinks import RecordingSink
    from tests.support.live_dirs import write_live

    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "job")
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), catalog.claim_generation().generation)
    for batch in range(4):
        write_live(live, batch)
        if batch == 2:
            (live / "state/0/0/3.zip").write_bytes(b"snapshot of version 3")
        assert coord.checkpoint(batch) is not None
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    counts: dict[str, int] = {}
    index = materialize(handle, str(tmp_path / "restored"), counts=counts, only_read=True, repair=False)
    state = sorted(p.name for p in (tmp_path / "restored/state/0/0").iterdir())
    assert state == ["3.changelog", "3.zip", "4.changelog"]
    assert counts["skipped"] == 2 and counts["downloaded"] == len(handle.metadata.files) - 2
    assert set(index) == {ref.path for ref in handle.metadata.files} - {"state/0/0/1.changelog",
                                                                         "state/0/0/2.changelog"}
    materialize(handle, str(tmp_path / "whole"))  # inspection and verification read every file
    assert len(list((tmp_path / "whole/state/0/0").iterdir())) == 5
    # Spark 4.1+ repair falls back to version 0 here (the only snapshot is 3): nothing skipped
    counts.clear()
    materialize(handle, str(tmp_path / "repairable"), counts=counts, only_read=True, repair=True)
    assert counts["skipped"] == 0 and len(list((tmp_path / "repairable/state/0/0").iterdir())) == 5
