"""`load_snapshot` reads ``_metadata`` with its limit: an over-limit one is corrupt."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.exceptions import CorruptMetadata
from airflow_sparkpoint.runtime.verify import load_snapshot
from airflow_sparkpoint.storage import LocalStorage
from tests.support.records import checkpoint_at


def test_an_oversized_metadata_is_corrupt_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = Catalog(LocalStorage(str(tmp_path / "root")), "orders")
    catalog.claim_generation()
    checkpoint_at(catalog, 0)
    uri = catalog.checkpoint_uri(1)
    assert load_snapshot(uri).metadata.id == 1
    size = len(catalog.store.get(layout.checkpoint_metadata(1)))
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.METADATA, size - 1)
    with pytest.raises(CorruptMetadata, match="limit"):
        load_snapshot(uri)
