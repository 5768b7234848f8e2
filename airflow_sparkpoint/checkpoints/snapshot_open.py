"""Opening a checkpoint or savepoint directory by URI or path (a restore target), with
every referenced file checked by listing. Pure Python: no Spark, no Airflow."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog_types import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata
from airflow_sparkpoint.exceptions import CorruptMetadata, ObjectNotFound, RestoreError, StorageError
from airflow_sparkpoint.storage import Storage, open_storage

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.lineage import Origin

__all__ = ["open_restart_snapshot", "open_snapshot", "stored_sizes"]

log = logging.getLogger(__name__)


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


def open_snapshot(uri: str, *, storage_options: Mapping[str, Any] | None = None,
                  store: Storage | None = None) -> SnapshotHandle:
    """Open a checkpoint or savepoint directory given by URI or path (for ``restore=``).
    `store`: the directory, already open (a savepoint-shaped one: a savepoint or a pin).

    :raises RestoreError: there is no valid ``_metadata`` there, or a referenced file is
        missing, or `store` holds a checkpoint.
    """
    given = store is not None
    store = store if store is not None else open_storage(uri, **dict(storage_options or {}))
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
    if meta.kind == "checkpoint" and given:
        raise RestoreError(f"{uri} holds a checkpoint's _metadata outside chk-<id>; expected a savepoint")
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


def open_restart_snapshot(uri: str, origin: Origin,
                          opener: Callable[[str], SnapshotHandle]) -> SnapshotHandle:
    """The snapshot a lineage without a checkpoint of its own stands at: `uri` (its
    origin's savepoint or snapshot), else the copy `origin`'s generation owns
    (`Origin.pin`), when `uri` is gone or damaged; each opened by `opener` (`open_snapshot`
    with the store's options; the commit step: `SnapshotStore.open_in_root`). What a
    restart restores and what the external commit step confirms against.

    :raises RestoreError: neither can be opened.
    """
    try:
        return opener(uri)
    except RestoreError as exc:
        if origin.pin is not None and origin.pin != uri:
            try:
                handle = opener(origin.pin)
            except RestoreError:
                pass
            else:
                log.warning("%s; using %s, the copy of it that generation %d owns", exc, origin.pin,
                            origin.generation)
                return handle
        raise RestoreError(
            f"{exc}; it is where the lineage of generation {origin.generation} started, and that lineage "
            "has no completed checkpoint of its own. See `sparkpoint list`; restore another savepoint or "
            "checkpoint by path, or start with empty state on purpose with spark.sparkpoint.restore=none "
            "and spark.sparkpoint.restore.force=true"
        ) from exc
