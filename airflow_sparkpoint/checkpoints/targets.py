"""Opening a checkpoint or savepoint directory by URI or path (a restore target), with
every referenced file checked by listing. Pure Python: no Spark, no Airflow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.entries import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.exceptions import CorruptMetadata, ObjectNotFound, RestoreError, StorageError
from airflow_sparkpoint.storage import open_storage

__all__ = ["open_snapshot"]


def open_snapshot(uri: str, *, storage_options: Mapping[str, Any] | None = None) -> SnapshotHandle:
    """Open a checkpoint or savepoint directory given by URI or path (for ``restore=``).

    :raises RestoreError: there is no valid ``_metadata`` there, or a referenced file is missing.
    """
    store = open_storage(uri, **dict(storage_options or {}))
    try:
        data = store.get(layout.METADATA, layout.max_bytes_of(layout.METADATA))
    except ObjectNotFound:
        raise RestoreError(
            f"restore target {uri} has no _metadata; expected a savepoint or checkpoint directory "
            "(see `sparkpoint list`)"
        ) from None
    except StorageError as exc:
        raise RestoreError(f"restore target {uri} cannot be read: {exc}") from exc
    try:
        meta = SnapshotMetadata.from_bytes(data, where=f"{uri.rstrip('/')}/_metadata")
    except CorruptMetadata as exc:
        raise RestoreError(f"restore target is corrupt: {exc}") from exc
    if meta.kind == "checkpoint":
        # Checkpoint file keys are relative to the job root, the parent of chk-<id>.
        parent = uri.rstrip("/").rsplit("/", 1)[0]
        files_store = open_storage(parent, **dict(storage_options or {}))
    else:
        files_store = store
    # One listing per top-level directory the files live in, not one request per file.
    present: dict[str, int] = {}
    for top in sorted({ref.key.split("/", 1)[0] for ref in meta.files if "/" in ref.key}):
        present.update((info.key, info.size) for info in files_store.list(top))
    for ref in meta.files:
        size = present.get(ref.key)
        if size is None and "/" not in ref.key:
            try:
                size = files_store.stat(ref.key).size
            except ObjectNotFound:
                size = None
        if size is None:
            raise RestoreError(f"restore target {uri} is incomplete: file {ref.key} is missing")
        if size != ref.size:
            raise RestoreError(f"restore target {uri} is corrupt: file {ref.key} has {size} bytes, expected {ref.size}")
    return SnapshotHandle(uri.rstrip("/"), meta, files_store)
