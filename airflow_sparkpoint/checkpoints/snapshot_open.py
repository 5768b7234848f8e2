"""Opening a checkpoint or savepoint directory by URI or path (a restore target), with
every referenced file checked by listing. Pure Python: no Spark, no Airflow."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog_types import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata
from airflow_sparkpoint.exceptions import (
    CorruptMetadata,
    ObjectNotFound,
    ObjectTooLarge,
    RestoreError,
    StorageError,
)
from airflow_sparkpoint.storage import Storage, open_storage

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.lineage import Origin

__all__ = [
    "open_restart_snapshot", "open_snapshot", "read_metadata", "restored_by", "snapshot_at", "stored_sizes",
]

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


def read_metadata(store: Storage, key: str, where: str) -> SnapshotMetadata:
    """The snapshot ``_metadata`` at `key` of `store`, read within its size limit and
    decoded (`where` names it in messages).

    :raises ObjectNotFound: there is no object at `key`.
    :raises CorruptMetadata: it fails its checksum or schema, or is over its size limit.
    :raises StorageError: the store cannot be read.
    """
    try:
        data = store.get(key, layout.max_bytes_of(layout.METADATA))
    except ObjectTooLarge as exc:  # planted or garbled
        raise CorruptMetadata(str(exc)) from exc
    return SnapshotMetadata.from_bytes(data, where=where)


def snapshot_at(uri: str, *, storage_options: Mapping[str, Any] | None = None,
                store: Storage | None = None, named: str | None = None) -> SnapshotHandle:
    """A handle on the checkpoint or savepoint directory `uri` (`store`: that directory,
    already open) from its ``_metadata`` alone, its files not checked (`open_snapshot`
    checks them). A checkpoint's file keys resolve against the job root, the parent of
    ``chk-<id>``. `named`: how messages name the directory (default: `uri`).

    :raises RestoreError: there is no ``_metadata`` at `uri` (not a snapshot).
    :raises CorruptMetadata: ``_metadata`` fails its checksum or schema, or is over its
        size limit.
    :raises StorageError: the store cannot be read.
    """
    text = uri.rstrip("/")
    options = dict(storage_options or {})
    store = store if store is not None else open_storage(text, **options)
    try:
        meta = read_metadata(store, layout.METADATA, f"{text}/{layout.METADATA}")
    except ObjectNotFound:
        raise RestoreError(f"{named or text} has no _metadata; expected a savepoint or checkpoint directory "
                           "(see `sparkpoint list`)") from None
    files_store = open_storage(text.rsplit("/", 1)[0], **options) if meta.kind == "checkpoint" else store
    return SnapshotHandle(text, meta, files_store)


def open_snapshot(uri: str, *, storage_options: Mapping[str, Any] | None = None,
                  store: Storage | None = None) -> SnapshotHandle:
    """Open a checkpoint or savepoint directory given by URI or path (for ``restore=``),
    every file its ``_metadata`` references checked (`snapshot_at`). `store`: the
    directory, already open (a savepoint-shaped one: a savepoint or a pin).

    :raises RestoreError: there is no valid ``_metadata`` there (corrupt or over its size
        limit included), or it cannot be read, or a referenced file is missing, or
        `store` holds a checkpoint.
    :raises ConfigError: `uri` names no store (`InvalidPath`: a key escapes its root).
    """
    # a URI that cannot name a store (InvalidPath, ConfigError) is raised as it is
    opened = store if store is not None else open_storage(uri, **dict(storage_options or {}))
    try:
        handle = snapshot_at(uri, storage_options=storage_options, store=opened,
                             named=f"restore target {uri}")
    except CorruptMetadata as exc:
        raise RestoreError(f"restore target is corrupt: {exc}") from exc
    except StorageError as exc:
        raise RestoreError(f"restore target {uri} cannot be read: {exc}") from exc
    if handle.metadata.kind == "checkpoint" and store is not None:
        raise RestoreError(f"{uri} holds a checkpoint's _metadata outside chk-<id>; expected a savepoint")
    for ref, size in stored_sizes(handle.files_store, handle.metadata.files):
        problem = ref.stored_problem(size)
        if problem is not None:
            raise RestoreError(f"restore target {uri} is {'incomplete' if size is None else 'corrupt'}: file "
                               f"{problem}")
    return handle


def restored_by(meta: SnapshotMetadata, origin: Origin) -> bool:
    """Whether `meta` is the snapshot `origin` restored (its id and batch): a shared place
    (a moved copy) may hold another one since."""
    return (meta.id, meta.batch_id) == (origin.snapshot_id, origin.batch_id)


def open_restart_snapshot(uri: str, origin: Origin,
                          opener: Callable[[str], SnapshotHandle]) -> SnapshotHandle:
    """The snapshot a lineage without a checkpoint of its own stands at: `uri` (its
    origin's savepoint or snapshot), else the copy `origin`'s generation owns
    (`Origin.pin`), when `uri` is gone, damaged or holds another snapshot than the one
    `origin` restored (`restored_by`: a moved copy replaced since); each opened by
    `opener` (`open_snapshot` with the store's options; the commit step:
    `SnapshotStore.open_in_root`). What a restart restores and what the external commit
    step confirms against.

    :raises RestoreError: neither can be opened.
    """
    try:
        handle = opener(uri)
        if origin.snapshot_id is not None and not restored_by(handle.metadata, origin):
            meta = handle.metadata
            raise RestoreError(
                f"{uri} holds snapshot {meta.id} (batch {meta.batch_id}), not snapshot {origin.snapshot_id} "
                f"(batch {origin.batch_id}) that generation {origin.generation} restored: replaced since"
            )
        return handle
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
