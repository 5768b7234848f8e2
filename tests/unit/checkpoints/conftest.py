"""Fixtures for the catalog tests: one storage root per backend (memory, local, S3).

`root_uri` is the storage root as a URI, so a test can also open the same root from
another process or through `open_snapshot`; `open_root()` opens it again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata, SnapshotStats, sha256_hex
from airflow_sparkpoint.storage import MemoryStorage, Storage, open_storage

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


def put_checkpoint(
    catalog: Catalog,
    files: dict[str, bytes],
    *,
    batch_id: int | None = None,
    generation: int | None = None,
    created_at: float | None = None,
) -> SnapshotMetadata:
    """Upload `files` (path → bytes) into shared/ (once per content) and complete a
    checkpoint referencing them, as the runtime's coordinator does."""
    refs = []
    for path, data in sorted(files.items()):
        sha = sha256_hex(data)
        key = catalog.shared_key(path, sha)
        if not catalog.store.exists(key):
            catalog.store.put(key, data)
        refs.append(FileRef(path=path, key=key, size=len(data), sha256=sha))
    checkpoint_id = catalog.next_checkpoint_id()
    meta = SnapshotMetadata(
        kind="checkpoint",
        id=checkpoint_id,
        job=catalog.job,
        generation=catalog.current_generation() if generation is None else generation,
        batch_id=checkpoint_id - 1 if batch_id is None else batch_id,
        created_at=time.time() if created_at is None else created_at,
        files=tuple(refs),
        stats=SnapshotStats(duration_ms=5, bytes_copied=sum(map(len, files.values())), files_copied=len(files),
                            bytes_total=sum(map(len, files.values())), file_count=len(files)),
    )
    catalog.complete_checkpoint(meta)
    return meta


@pytest.fixture()
def make_checkpoint() -> Callable[..., SnapshotMetadata]:
    """`put_checkpoint` as a fixture (test modules do not import conftest)."""
    return put_checkpoint
