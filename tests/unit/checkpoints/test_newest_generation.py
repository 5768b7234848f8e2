"""The newest generation without listing every claim (issue 32): a job started every few
minutes (an ``availableNow`` job an asset or a schedule triggers) claims ≈ 100,000
generations a year, and every status read (sensors, triggers, the UI, each run's start)
asked for the newest one with a listing of all of them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.generations import newest_generation
from airflow_sparkpoint.storage import MemoryStorage, ObjectInfo


class Watching(MemoryStorage):
    """Counts the keys its listings yield and its existence checks."""

    def __init__(self) -> None:
        super().__init__(f"newest-generation-{uuid.uuid4().hex}")
        self.listed = 0
        self.checks = 0

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for info in super().list(prefix):
            self.listed += 1
            yield info

    def stat(self, key: str) -> ObjectInfo:  # what an existence check asks (a HEAD on S3)
        self.checks += 1
        return super().stat(key)


def claims(store: MemoryStorage, count: int) -> None:
    for generation in range(1, count + 1):
        store.put(f"job/{layout.generation_key(generation)}", json.dumps({"generation": generation}).encode())


@pytest.mark.parametrize("count", [0, 1, 2, 5, 999, 1000, 1001, 2500, 70_000])
def test_the_newest_generation_is_found_whatever_the_count(count: int) -> None:
    store = Watching()
    claims(store, count)
    catalog = Catalog(store, "job")
    assert catalog.current_generation() == count
    assert store.listed <= layout.GENERATIONS_LISTED, "at most one page of claims is listed"
    assert store.checks <= 2 * max(1, count).bit_length() + 2, store.checks
    store.checks = store.listed = 0
    assert catalog.current_generation() == count
    assert (store.listed, store.checks) == ((0, 1) if count else (0, 0)), \
        "a catalog asks only whether a newer one exists"
    catalog.claim_generation()
    assert catalog.current_generation() == count + 1


def test_from_a_known_generation_one_check_says_nothing_is_newer() -> None:
    store = Watching()
    claims(store, 40)
    assert (newest_generation(Catalog(store, "job").store, 40) == 40 and store.checks == 1
            and store.listed == 0)
    assert newest_generation(Catalog(store, "job").store, 33) == 40
