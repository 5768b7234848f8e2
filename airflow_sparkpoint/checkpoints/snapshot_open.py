"""Opening a checkpoint or savepoint directory by URI or path (a restore target), with
every referenced file checked by listing. Pure Python: no Spark, no Airflow."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog_types import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata
from airflow_sparkpoint.exceptions import CorruptMetadata, ObjectNotFound, RestoreError, StorageError
from airflow_sparkpoint.storage import Storage, open_storage

__all__ = ["open_snapshot", "stored_sizes"]


def stored_sizes(
    store: Storage, files: Iterable[FileRef], *, missing_on: tuple[type[Exception], ...] = (ObjectNotFound,)
) -> list[tuple[FileRef, int | None]]:
    """Each of `files` with the size `store` holds for it (None: missing), found with one
    listing per top-level directory of the keys, not one request per file; a key at the
    top level is stat'ed. A stat that raises one of `missing_on` counts as missing.

    :raises StorageError: a listing failed, or a stat failed otherwise.
    """
    refs = list(files)
    present: dict[str, int] = {}
    for top in sorted({ref.key.split("/", 1)[0] for ref in refs if "/" in ref.key}):
        present.update((info.key, info.size) for info in store.list(top))
    sizes: list[tuple[FileRef, int | None]] = []
    for ref in refs:
        size = present.get(ref.key)
        if size is None and "/" not in ref.key:
            try:
                size = store.stat(ref.key).size
            except missing_on:
                size = None
        sizes.append((ref, size))
    return sizes


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
    for ref, size in stored_sizes(files_store, meta.files):
        problem = ref.stored_problem(size)
        if problem is not None:
            raise RestoreError(f"restore target {uri} is {'incomplete' if size is None else 'corrupt'}: file "
                               f"{problem}")
    return SnapshotHandle(uri.rstrip("/"), meta, files_store)
