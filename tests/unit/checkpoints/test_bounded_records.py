"""Every record of a job is read with a size limit, and an over-limit ``_metadata`` is a
corrupt snapshot (skipped with a warning naming it, invariant 1), never an error that
blocks restores, listings or retention; one over the limit is refused at write time."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.counters import read_counters
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.checkpoints.run_result import result_key
from airflow_sparkpoint.checkpoints.verification import read_verification, verification_key
from airflow_sparkpoint.exceptions import CatalogError
from tests.support.records import big_job_metadata

MakeCheckpoint = Callable[..., SnapshotMetadata]


def plant_oversized_metadata(catalog: Catalog, checkpoint_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``chk-<id>/_metadata`` one byte over its limit (the limit lowered for the test)."""
    key = layout.checkpoint_metadata(checkpoint_id)
    size = len(catalog.store.get(key))
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.METADATA, size - 1)


def test_an_oversized_metadata_is_skipped_as_corrupt_everywhere(
    catalog: Catalog, make_checkpoint: MakeCheckpoint, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    catalog.claim_generation()
    first = make_checkpoint(catalog, {"state/0": b"a"})
    # The newest checkpoint's _metadata is bigger than the older one's (more files).
    second = make_checkpoint(catalog, {f"state/{i}": b"b" * 10 for i in range(20)})
    plant_oversized_metadata(catalog, second.id, monkeypatch)
    assert (len(catalog.store.get(layout.checkpoint_metadata(first.id)))
            <= layout.max_bytes_of(layout.METADATA))

    with caplog.at_level(logging.WARNING):
        latest = catalog.latest()
    assert latest is not None and latest.id == first.id
    assert any(f"chk-{second.id}" in r.getMessage() and "limit" in r.getMessage() for r in caplog.records)
    point = catalog.restart_point()
    assert point.checkpoint is not None and point.checkpoint.id == first.id
    entries = {e.id: e for e in catalog.list_checkpoints()}
    assert entries[second.id].metadata is None and "limit" in (entries[second.id].error or "")
    assert entries[first.id].metadata is not None
    result = enforce_checkpoint_retention(catalog, 1)
    assert first.id not in result.deleted_checkpoints


def test_a_metadata_over_the_limit_is_refused_at_write_time(
    catalog: Catalog, make_checkpoint: MakeCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.claim_generation()
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.METADATA, 200)
    with pytest.raises(CatalogError, match="limit"):
        make_checkpoint(catalog, {f"state/{i}": b"x" for i in range(5)})
    assert not any(catalog.store.exists(layout.checkpoint_metadata(cid)) for cid in catalog.checkpoint_ids())
    assert catalog.latest() is None


def test_a_savepoint_whose_metadata_is_over_the_limit_is_refused(
    catalog: Catalog, make_checkpoint: MakeCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.claim_generation()
    meta = make_checkpoint(catalog, {f"state/{i}": b"x" for i in range(5)})
    size = len(catalog.store.get(layout.checkpoint_metadata(meta.id)))
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.METADATA, size // 2)
    with pytest.raises(CatalogError, match="limit"):
        catalog.create_savepoint(catalog.handle(meta))
    assert not any(info.key.endswith(f"/{layout.METADATA}") for info in catalog.store.list(layout.SAVEPOINTS))


def test_the_metadata_limits_admit_a_big_job_and_refuse_what_no_reader_can_hold() -> None:
    # A big job has tens of thousands of files (200 partitions x 4 operators x ~60 files):
    # written and read back. Twice that is refused at write time, never left unreadable.
    data = big_job_metadata(60_000)
    layout.check_metadata_size(data, "chk-1/_metadata")
    assert len(SnapshotMetadata.from_bytes(data).files) == 60_000
    with pytest.raises(CatalogError, match="limit"):
        layout.check_metadata_size(big_job_metadata(120_000), "chk-1/_metadata")


@pytest.mark.parametrize("key", [
    layout.STATUS,
    layout.status_key(7),
    "checkpoint-counters.json",
    layout.ID_FLOOR,
    layout.generation_key(7),
    layout.lineage_key(7),
    layout.gc_key(123, "abcd1234"),
    layout.txn_key(3, 7),
    result_key(7),
    f"{layout.CONTROL}/r1.request.json",
    layout.checkpoint_metadata(7),
    f"{layout.savepoint_dir(7, 'ab12')}/{layout.METADATA}",
    f"{layout.pin_dir(7)}/{layout.METADATA}",
    verification_key(layout.checkpoint_dir(7)),
    verification_key(layout.savepoint_dir(7, "ab12")),
])
def test_every_record_a_job_writes_is_bounded(key: str) -> None:
    limit = layout.max_bytes_of(key)
    assert limit is not None and limit > 0, f"{key} is read unbounded"


@pytest.mark.parametrize("key", [
    f"{layout.SHARED}/state/0/1.delta~0123456789abcdef",
    f"{layout.savepoint_dir(7, 'ab12')}/files/state/0/1.delta",
    f"{layout.pin_dir(7)}/files/offsets/3",
])
def test_snapshot_files_are_streamed_not_bounded(key: str) -> None:
    assert layout.max_bytes_of(key) is None


def test_every_key_name_layout_knows_has_a_limit() -> None:
    """No kind of record layout names (a file name or a top-level directory) falls
    through to unbounded: only the directories of snapshot files are read streamed."""
    snapshot_files = {layout.SHARED, layout.SAVEPOINTS, layout.PINS}
    names = {value for name, value in vars(layout).items() if name.isupper() and isinstance(value, str)}
    assert {layout.STATUS, layout.STATUS_DIR, layout.COUNTERS, layout.VERIFICATION, layout.METADATA} <= names
    unbounded = sorted(name for name in names - snapshot_files if layout.max_bytes_of(name) is None)
    assert unbounded == []


def oversized(catalog: Catalog, key: str, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    catalog.store.put(key, b"{" + b" " * 4096 + b"}")
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, name, 1024)


def test_an_oversized_generation_status_is_unreadable(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    oversized(catalog, layout.status_key(3), monkeypatch, layout.STATUS_DIR)
    with caplog.at_level(logging.WARNING):
        assert catalog.read_status(3) is None
    assert any("limit" in r.getMessage() for r in caplog.records)


def test_oversized_counters_are_unreadable(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    oversized(catalog, layout.COUNTERS, monkeypatch, layout.COUNTERS)
    with caplog.at_level(logging.WARNING):
        read_counters(catalog)
    assert any("limit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("snapshot", [layout.checkpoint_dir(7), layout.savepoint_dir(7, "ab12")])
def test_an_oversized_verification_record_is_unreadable(
    catalog: Catalog, snapshot: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    oversized(catalog, verification_key(snapshot), monkeypatch, layout.VERIFICATION)
    with caplog.at_level(logging.WARNING):
        assert read_verification(catalog.store, snapshot) is None
    assert any("limit" in r.getMessage() for r in caplog.records)

