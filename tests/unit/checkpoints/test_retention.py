"""Savepoint history retention: max count, max age (with a fake clock), always one kept."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
from airflow_sparkpoint.exceptions import ConfigError

HOUR = 3600.0
T0 = 1_800_000_000.0


@pytest.fixture()
def savepoints(catalog: Catalog, make_checkpoint: Callable[..., SnapshotMetadata]) -> list[SnapshotHandle]:
    """Four savepoints of one checkpoint, created 4, 3, 2 and 1 hours before T0 (oldest first)."""
    catalog.claim_generation()
    meta = make_checkpoint(catalog, {"offsets/0": b"0", "state/0/1/1.delta": b"s"})
    handles = []
    for hours_ago in (4, 3, 2, 1):
        handle = catalog.create_savepoint(catalog.handle(meta))
        backdated = handle.metadata.with_(created_at=T0 - hours_ago * HOUR)
        catalog.store.put(f"{handle.uri[len(catalog.uri) + 1:]}/_metadata", backdated.to_bytes())
        handles.append(SnapshotHandle(handle.uri, backdated, handle.files_store))
    return handles


def uris(catalog: Catalog) -> list[str]:
    return [e.uri for e in catalog.list_savepoints()]


def test_max_count_keeps_the_newest(catalog: Catalog, savepoints: list[SnapshotHandle]) -> None:
    disposed = savepoint_history_retention(catalog, max_count=2, max_age_s=None, now=T0)
    assert disposed == [savepoints[1].uri, savepoints[0].uri]
    assert uris(catalog) == [savepoints[3].uri, savepoints[2].uri]
    assert savepoint_history_retention(catalog, max_count=2, max_age_s=None, now=T0) == []


def test_max_age_uses_the_given_clock(catalog: Catalog, savepoints: list[SnapshotHandle]) -> None:
    disposed = savepoint_history_retention(catalog, max_count=None, max_age_s=2.5 * HOUR, now=T0)
    assert disposed == [savepoints[1].uri, savepoints[0].uri]
    assert uris(catalog) == [savepoints[3].uri, savepoints[2].uri]


def test_always_keeps_the_newest_valid_one(catalog: Catalog, savepoints: list[SnapshotHandle]) -> None:
    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=60, now=T0 + 100 * HOUR)
    assert len(disposed) == 3
    assert uris(catalog) == [savepoints[3].uri]
    assert savepoint_history_retention(catalog, max_count=1, max_age_s=1, now=T0 + 1000 * HOUR) == []
    assert uris(catalog) == [savepoints[3].uri]


def test_no_limits_dispose_nothing(catalog: Catalog, savepoints: list[SnapshotHandle]) -> None:
    assert savepoint_history_retention(catalog, max_count=None, max_age_s=None, now=T0 + 1000 * HOUR) == []
    assert len(uris(catalog)) == 4


def test_checkpoints_are_not_touched(catalog: Catalog, savepoints: list[SnapshotHandle]) -> None:
    before = catalog.latest()
    savepoint_history_retention(catalog, max_count=1, max_age_s=None, now=T0)
    assert catalog.latest() == before


def test_incomplete_savepoints_are_removed_after_an_hour(catalog: Catalog, savepoints: list[SnapshotHandle],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    partial = "savepoints/savepoint-99-abcdef12"
    catalog.store.put(f"{partial}/files/offsets/0", b"half")
    assert savepoint_history_retention(catalog, max_count=None, max_age_s=None, now=time.time()) == []
    assert catalog.store.exists(f"{partial}/files/offsets/0")
    disposed = savepoint_history_retention(catalog, max_count=None, max_age_s=None,
                                           now=time.time() + 2 * HOUR)
    assert disposed == [f"{catalog.uri}/{partial}"]
    assert not catalog.store.exists(f"{partial}/files/offsets/0")
    assert len(uris(catalog)) == 4


def test_corrupt_savepoints_are_kept_with_a_warning(catalog: Catalog, savepoints: list[SnapshotHandle],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    key = savepoints[3].uri[len(catalog.uri) + 1:]
    catalog.store.put(f"{key}/_metadata", b"{garbled")
    with caplog.at_level(logging.WARNING, logger="airflow_sparkpoint.checkpoints.retention"):
        disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None, now=T0 + 10 * HOUR)
    # the corrupt newest one does not count: the newest *valid* one (savepoints[2]) is kept
    assert disposed == [savepoints[1].uri, savepoints[0].uri]
    assert set(uris(catalog)) == {savepoints[3].uri, savepoints[2].uri}
    assert f"keeping invalid savepoint {savepoints[3].uri}" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_count": 0, "max_age_s": None}, "max_count=0 is invalid"),
        ({"max_count": -3, "max_age_s": None}, "max_count=-3 is invalid"),
        ({"max_count": 2.0, "max_age_s": None}, "max_count=2.0 is invalid"),
        ({"max_count": True, "max_age_s": None}, "max_count=True is invalid"),
        ({"max_count": None, "max_age_s": 0}, "max_age_s=0 is invalid"),
        ({"max_count": None, "max_age_s": float("nan")}, "max_age_s=nan is invalid"),
        ({"max_count": None, "max_age_s": "1d"}, "max_age_s='1d' is invalid"),
    ],
)
def test_arguments_are_validated(catalog: Catalog, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        savepoint_history_retention(catalog, **kwargs)
