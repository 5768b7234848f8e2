"""Fixtures for the catalog tests: one storage root per backend (memory, local, S3).

`root_uri` is the storage root as a URI, so a test can also open the same root from
another process or through `open_snapshot`; `open_root()` opens it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.storage import MemoryStorage, Storage, open_storage
from tests.support.records import put_checkpoint

BACKENDS = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]


@dataclass
class Root:
    kind: str
    uri: str
    options: dict[str, Any]

    def open(self) -> Storage:
        return open_storage(self.uri, **self.options)

    def catalog(self, job: str = "orders") -> Catalog:
        return Catalog(self.open(), job)


@pytest.fixture(params=BACKENDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Root]:
    kind = request.param
    if kind == "memory":
        name = f"t-{uuid.uuid4().hex[:10]}"
        yield Root(kind, f"memory://{name}/root", {})
        MemoryStorage.reset(name)
    elif kind == "local":
        yield Root(kind, str(tmp_path / "root"), {})
    else:
        endpoint = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        yield Root(kind, f"s3://{bucket}/root", {"endpoint_url": endpoint, "region_name": "us-east-1"})


@pytest.fixture()
def catalog(root: Root) -> Catalog:
    return root.catalog()


@pytest.fixture()
def open_root(root: Root) -> Callable[[], Storage]:
    return root.open


@pytest.fixture()
def make_checkpoint() -> Callable[..., SnapshotMetadata]:
    """`tests.support.records.put_checkpoint` as a fixture."""
    return put_checkpoint
