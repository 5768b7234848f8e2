"""The fixtures the cutover tests of the services share: job ``orders`` on fresh in-memory
storage (reset afterwards) and a fresh fake sink."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.fake_sinks import FakeSink


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


@pytest.fixture()
def sink() -> FakeSink:
    return FakeSink(f"s-{uuid.uuid4().hex[:8]}")
