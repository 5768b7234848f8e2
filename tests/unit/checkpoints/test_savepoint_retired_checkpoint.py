"""A savepoint copied from the latest checkpoint (no live run) while checkpoint retention
retires that checkpoint (a new lineage's first run, numRetained=1): found by the
simulation (the generic family, seed 20261128 of tests/simulation/test_protocol.py, with
the cutover actor in the space): "a3-savepoint failed unexpectedly: ObjectNotFound:
…/shared/state/0/0/2.snapshot~… does not exist". The copy goes to the newest checkpoint
instead of failing with a storage error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.services.savepoint import savepoint_from_latest_checkpoint, savepoint_source
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.records import put_checkpoint


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


def test_a_checkpoint_retired_while_it_is_copied_gives_way_to_the_newest(catalog: Catalog,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    catalog.claim_generation()
    old = put_checkpoint(catalog, {"state/0/0/1.snapshot": b"old"}, batch_id=0)
    real = Catalog.create_savepoint
    calls: list[int] = []

    def retired_meanwhile(self: Catalog, source: Any, **kwargs: Any) -> Any:
        calls.append(source.metadata.id)
        if len(calls) == 1:  # retention of a newer checkpoint removes the one being copied
            put_checkpoint(catalog, {"state/0/0/2.snapshot": b"new"}, batch_id=1)
            catalog.store.delete([layout.checkpoint_metadata(old.id),
                                  *(ref.key for ref in old.files)])
        return real(self, source, **kwargs)

    monkeypatch.setattr(Catalog, "create_savepoint", retired_meanwhile)
    latest, handle = savepoint_from_latest_checkpoint(catalog, savepoint_source(catalog, 60.0), refused_by=None)
    assert calls == [old.id, old.id + 1]
    assert latest.id == old.id + 1 and handle.metadata.batch_id == 1
