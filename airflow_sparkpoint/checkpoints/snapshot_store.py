"""The snapshots of one job: completed checkpoints (``chk-<id>/_metadata``), savepoints,
the content-addressed shared files they reference and the id floor of disposed ones.

Invariant 1 lives here: a snapshot is complete iff its ``_metadata`` exists and
validates (`checkpoint_entry`); anything else is listed with the reason it is unusable.
Which of the valid checkpoints a restore may use (lineages, invariant 9) is the read
model's (`checkpoints.lineage_view`). Pure Python over a `Storage`: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry, SnapshotHandle
from airflow_sparkpoint.checkpoints.generations import Fence, GenerationStore
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata, SnapshotStats
from airflow_sparkpoint.checkpoints.snapshot_open import open_snapshot, read_metadata
from airflow_sparkpoint.checkpoints.transfer import transfer_all
from airflow_sparkpoint.exceptions import (
    CatalogError,
    CorruptMetadata,
    InvalidPath,
    ObjectNotFound,
    RestoreError,
)
from airflow_sparkpoint.storage import Storage, normalize_key

__all__ = ["SAVEPOINT_IDS_TTL_S", "SnapshotStore"]

log = logging.getLogger(__name__)

#: How long a running job's numbering of its checkpoints trusts its last listing of
#: ``savepoints/`` (it numbers one every few seconds, and the listing grows with the
#: savepoints a job keeps). The savepoints it makes itself count at once; another process
#: makes a savepoint of a new id only from a savepoint (one of a checkpoint takes the
#: checkpoint's id), and the job sees it within this time.
SAVEPOINT_IDS_TTL_S = 60.0


class SnapshotStore:
    """The checkpoints and savepoints of one job (`store`: its keys, at `uri`); completing
    a checkpoint is fenced by `generations` (invariant 5)."""

    def __init__(self, store: Storage, job: str, uri: str, generations: GenerationStore) -> None:
        self.store = store
        self.job = job
        self.uri = uri
        self._generations = generations
        self._newest_savepoint: tuple[float, int] | None = None  # (monotonic time listed, id)

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-<id>`` directory, complete or not, ascending."""
        ids = []
        for name in self.store.list_dirs(""):
            match = layout.CHK_RE.match(name)
            if match:
                ids.append(int(match.group(1)))
        return sorted(ids)

    def next_checkpoint_id(self, ids: Iterable[int] | None = None, *, recent_savepoints: bool = False) -> int:
        """One more than any id in use or ever disposed: like Flink's, ids are never reused,
        so "a checkpoint after id N" keeps its meaning after a rollback retires the newest.
        `ids`: the caller's `checkpoint_ids` listing, taken just before (else one is taken).
        `recent_savepoints`: a listing of ``savepoints/`` up to `SAVEPOINT_IDS_TTL_S` old
        will do (a running job numbering its checkpoints)."""
        ids = self.checkpoint_ids() if ids is None else list(ids)
        return max([0, *ids, self._newest_savepoint_id(recent_savepoints), self._id_floor()]) + 1

    def _newest_savepoint_id(self, recent: bool) -> int:
        now = time.monotonic()
        known = self._newest_savepoint
        if recent and known is not None and now - known[0] < SAVEPOINT_IDS_TTL_S:
            return known[1]
        newest = max((e.id for e in self._savepoint_dirs()), default=0)
        self._newest_savepoint = (now, newest)
        return newest

    def _id_floor(self) -> int:
        """The highest id ever disposed (0: none, or its record is unreadable: logged)."""
        floor = bounded.read_record_or_warn(self.store, layout.ID_FLOOR, _integer,
                                            limits=layout.limits_of(layout.ID_FLOOR),
                                            where=f"{self.uri}/{layout.ID_FLOOR}", what="id floor")
        return floor or 0

    def _raise_id_floor(self, sid: int) -> None:
        # Not atomic: of two concurrent disposals the lower id may win. Disposals are
        # operator or rollback actions, one at a time in practice.
        if sid > self._id_floor():
            self.store.put(layout.ID_FLOOR, str(sid).encode())

    def checkpoint_entry(
        self, checkpoint_id: int, present: Mapping[str, int] | None = None,
        known: SnapshotMetadata | None = None
    ) -> SnapshotEntry:
        """Checkpoint `checkpoint_id` as listed: with its metadata when its ``_metadata``
        validates and every file it references is in `present` (shared key -> size; None:
        look each up), else with the error that makes it unusable (invariant 1).

        `known`: its ``_metadata`` as this process wrote or read it before (written once,
        ids never reused), used instead of reading it again; its files are still checked."""
        return self._read_entry("checkpoint", checkpoint_id, layout.checkpoint_dir(checkpoint_id), present,
                                "", known)

    def _read_entry(
        self, kind: str, sid: int, key: str, present: Mapping[str, int] | None, base: str,
        known: SnapshotMetadata | None = None,
    ) -> SnapshotEntry:
        uri = f"{self.uri}/{key}"
        try:
            # corrupt (planted, garbled, oversized) is an entry's error, never the listing's
            meta = known or read_metadata(self.store, f"{key}/{layout.METADATA}", f"{uri}/{layout.METADATA}")
        except ObjectNotFound:
            return SnapshotEntry(kind, sid, uri, key, error="no _metadata (incomplete or abandoned)")
        except CorruptMetadata as exc:
            return SnapshotEntry(kind, sid, uri, key, error=str(exc))
        try:
            if meta.job != self.job:
                raise CorruptMetadata(f"{uri}/_metadata belongs to job {meta.job!r}, not {self.job!r}")
            if meta.kind != kind:
                raise CorruptMetadata(f"{uri}/_metadata says kind {meta.kind!r}, expected {kind!r}")
            if meta.id != sid:
                raise CorruptMetadata(f"{uri}/_metadata describes {meta.kind} {meta.id}, not {sid}")
        except CorruptMetadata as exc:
            return SnapshotEntry(kind, sid, uri, key, error=str(exc))
        try:
            self._check_files(meta, present, base, uri, key)
        except CorruptMetadata as exc:
            return SnapshotEntry(kind, sid, uri, key, error=str(exc), written_by=meta.generation)
        return SnapshotEntry(kind, sid, uri, key, metadata=meta)

    def _check_files(
        self, meta: SnapshotMetadata, present: Mapping[str, int] | None, base: str, uri: str, key: str
    ) -> None:
        """Every referenced file exists with its recorded size.

        `present` is a listing that covers ``shared/`` (checkpoints) or the snapshot's own
        directory (savepoints); keys outside it are looked up with one listing of the
        snapshot directory and, failing that, one stat each.
        """
        listed: Mapping[str, int] = present or {}
        own: dict[str, int] = {}
        own_dir = f"{key}/"
        own_listed = False
        for ref in meta.files:
            full = f"{base}{ref.key}"
            size = listed.get(full, own.get(full))
            if size is None and full.startswith(own_dir) and not own_listed:
                own.update((info.key, info.size) for info in self.store.list(key))
                own_listed = True
                size = own.get(full)
            proven_absent = (present is not None and self._covered(full, base)) or (
                own_listed and full.startswith(own_dir)
            )
            if size is None and not proven_absent:
                try:
                    size = self.store.stat(full).size
                except ObjectNotFound:
                    size = None
            problem = ref.stored_problem(size)
            if problem is not None:
                raise CorruptMetadata(f"{uri}: referenced file {problem}")

    @staticmethod
    def _covered(full: str, base: str) -> bool:
        """Whether the `present` listing for `base` covers `full` (absence there is proof)."""
        return full.startswith(base) if base else full.startswith(f"{layout.SHARED}/")

    def shared_sizes(self) -> dict[str, int]:
        """Every key under ``shared/`` with its size (one listing)."""
        # One paginated listing instead of a request per referenced file.
        return {info.key: info.size for info in self.store.list(layout.SHARED)}

    def checkpoint_uri(self, checkpoint_id: int) -> str:
        return f"{self.uri}/{layout.checkpoint_dir(checkpoint_id)}"

    def shared_key(self, path: str, sha256: str) -> str:
        """Where a file of Spark's checkpoint location is stored: content-addressed per
        path, so a re-executed batch that rewrites a file never collides with the old one."""
        return f"{layout.SHARED}/{normalize_key(path)}~{sha256[:16]}"

    def complete_checkpoint(self, meta: SnapshotMetadata) -> str:
        """Write ``chk-<id>/_metadata`` last, checking the writer's generation before and after.

        :raises StaleGeneration: a newer generation exists (invariant 5); raised after the
            write too, when a newer generation claimed meanwhile (the checkpoint stays,
            superseded by the newer generation's origin).
        :raises ObjectExists: another writer completed the same checkpoint id.
        :raises CatalogError: the ``_metadata`` would be over the limit readers accept
            (`layout.check_metadata_size`); the checkpoint is not completed.
        """
        fence = Fence(self._generations, meta.generation)
        fence.check()
        key = layout.checkpoint_metadata(meta.id)
        body = meta.to_bytes()
        layout.check_metadata_size(body, f"{self.uri}/{key}")
        self.store.put_if_absent(key, body)
        # A newer generation may have claimed between the check and the write: then this
        # checkpoint lies above the newer generation's base (superseded, never restored
        # by `latest`), and the writer must not act on it (no commit).
        fence.check()
        return self.checkpoint_uri(meta.id)

    # ------------------------------------------------------------------ savepoints

    def _savepoint_dirs(self) -> list[SnapshotEntry]:
        return [entry for entry in map(self._savepoint_dir, self.store.list_dirs(layout.SAVEPOINTS))
                if entry is not None]

    def _savepoint_dir(self, name: str) -> SnapshotEntry | None:
        checkpoint = layout.savepoint_checkpoint(name)
        if checkpoint is None:
            return None
        key = f"{layout.SAVEPOINTS}/{name}"
        return SnapshotEntry("savepoint", checkpoint, f"{self.uri}/{key}", key)

    def list_savepoints(self, *, slim: bool = False) -> list[SnapshotEntry]:
        """Every savepoint directory, newest first, valid or with the reason it is not
        (`slim`: see `list_checkpoints`)."""
        result = [entry.slim() if slim else entry for entry in map(self._read_savepoint,
                                                                   self._savepoint_dirs())]
        return sorted(result, key=lambda e: (e.created_at, e.id), reverse=True)

    def savepoint_entry(self, name: str) -> SnapshotEntry | None:
        """The savepoint directory `name` (under ``savepoints/``, as `list_dirs` gives it),
        valid or with the reason it is not (one listing of it, then its ``_metadata``);
        None when `name` is not a savepoint directory's name."""
        entry = self._savepoint_dir(name)
        return self._read_savepoint(entry) if entry is not None else None

    def _read_savepoint(self, entry: SnapshotEntry) -> SnapshotEntry:
        present = {info.key: info.size for info in self.store.list(entry.key)}
        return self._read_entry("savepoint", entry.id, entry.key, present, f"{entry.key}/")

    def create_savepoint(
        self,
        source: SnapshotHandle,
        *,
        generation: int | None = None,
        on_copied: Callable[[int, int], None] | None = None,
        key: str | None = None,
    ) -> SnapshotHandle:
        """Copy a snapshot into a self-contained, relocatable savepoint of this job (at
        `key`, for a lineage's pin, instead of a new directory under ``savepoints/``).

        Files are copied (server-side within one store), never referenced, so retention
        and disposal of checkpoints cannot touch the savepoint. `on_copied(done, total)`
        is called after each file (progress; the runtime's fault hook).

        :raises CatalogError: its ``_metadata`` would be over the limit readers accept
            (`layout.check_metadata_size`), or a file of the source vanished during the copy
            (retention removed it); nothing is completed.
        """
        started = time.monotonic()
        meta = source.metadata
        sp_id = meta.id if meta.kind == "checkpoint" else self.next_checkpoint_id()
        if self._newest_savepoint is not None and sp_id > self._newest_savepoint[1]:
            self._newest_savepoint = (self._newest_savepoint[0], sp_id)
        sp_key = key or layout.savepoint_dir(sp_id, uuid.uuid4().hex[:8])
        # Within this job's store (a checkpoint, or another savepoint of the job) copy
        # server-side; from anywhere else, read and write the bytes.
        src_uri, own_uri = source.files_store.uri.rstrip("/"), self.store.uri.rstrip("/")
        src_prefix: str | None = None
        if src_uri == own_uri:
            src_prefix = ""
        elif src_uri.startswith(own_uri + "/"):
            src_prefix = src_uri[len(own_uri) + 1:] + "/"

        def savepoint_ref(ref: FileRef) -> FileRef:
            return FileRef(path=ref.path, key=f"files/{normalize_key(ref.path)}", size=ref.size,
                           sha256=ref.sha256, mtime_ns=ref.mtime_ns)

        copied = sum(ref.size for ref in meta.files)

        def savepoint_meta(files: tuple[FileRef, ...]) -> SnapshotMetadata:
            return meta.with_(
                kind="savepoint",
                id=sp_id,
                generation=meta.generation if generation is None else generation,
                created_at=time.time(),
                files=files,
                source_checkpoint=meta.id if meta.kind == "checkpoint" else meta.source_checkpoint,
                stats=SnapshotStats(
                    duration_ms=int((time.monotonic() - started) * 1000),
                    bytes_copied=copied,
                    files_copied=len(files),
                    bytes_total=copied,
                    file_count=len(files),
                ),
            )

        where = f"{self.uri}/{sp_key}/{layout.METADATA}"
        # Refused before copying anything (a savepoint no reader accepts is not worth a
        # copy), and again on the final bytes below.
        layout.check_metadata_size(savepoint_meta(tuple(map(savepoint_ref, meta.files))).to_bytes(), where)

        def copy_one(ref: FileRef) -> FileRef:
            dst = f"{sp_key}/{savepoint_ref(ref).key}"
            try:
                if src_prefix is not None:
                    self.store.copy(src_prefix + ref.key, dst)
                else:
                    source.files_store.copy_to(ref.key, self.store, dst)  # streamed, never whole in memory
            except ObjectNotFound:
                # Retention may remove a checkpoint whose copy stalled past its grace.
                raise CatalogError(
                    f"{meta.kind} {source.uri} (chk-{meta.id}): its file {ref.path} was removed while it "
                    "was copied into a savepoint (retention of a newer run?); nothing was made a "
                    "savepoint; take the savepoint again"
                ) from None
            return savepoint_ref(ref)

        # A few copies at a time (`transfer`); any failure raises before _metadata is written.
        files = transfer_all(copy_one, meta.files, on_done=on_copied)
        sp_meta = savepoint_meta(tuple(files))
        body = sp_meta.to_bytes()
        layout.check_metadata_size(body, where)
        self.store.put_if_absent(f"{sp_key}/{layout.METADATA}", body)
        uri = f"{self.uri}/{sp_key}"
        log.info("savepoint %s completed: batch %d, %d files, %d bytes", uri, meta.batch_id, len(files),
                 copied)
        return SnapshotHandle(uri=uri, metadata=sp_meta, files_store=self.store.child(sp_key))

    def dispose(self, uri: str) -> int:
        """Delete a savepoint (or a checkpoint) of this job by URI, path or directory key
        (``chk-7``, ``savepoints/savepoint-7-ab12cd34``); return how many objects were deleted.

        :raises RestoreError: the path is not a snapshot directory of this job.
        :raises InvalidPath: the path is malformed or contains ``..``.
        """
        key = self.snapshot_key(uri)
        keys = [info.key for info in self.store.list(key)]
        name = key.rsplit("/", 1)[-1]
        match = layout.CHK_RE.match(name) or layout.SAVEPOINT_RE.match(name)
        if match:
            self._raise_id_floor(int(match.group(1)))
        # _metadata first: from that moment the snapshot is incomplete, never half-deleted.
        self.store.delete([f"{key}/{layout.METADATA}"])
        self.store.delete(keys)
        log.info("disposed %s/%s (%d objects)", self.uri, key, len(keys))
        return len(keys)

    def delete_checkpoint(self, key: str) -> None:
        """Delete the checkpoint directory `key` (``chk-<id>``, as listed) that retention
        let go: its ``_metadata`` first, so that from then on it is incomplete, never
        half-deleted. Its id stays below the next one (the directory may go on being listed)
        and is not a disposal (no id floor)."""
        self.store.delete([f"{key}/{layout.METADATA}"])
        self.store.delete_prefix(key)

    def snapshot_key(self, uri: str, *, savepoint_only: bool = False) -> str:
        """The key of the checkpoint or savepoint directory (`savepoint_only`: savepoint)
        of this job that `uri` (a URI, path or key, maybe read from a record) names.

        :raises InvalidPath: malformed, or contains ``..``.
        :raises RestoreError: outside this job's root, or not such a directory.
        """
        key = self.key_of(uri)
        if not ((layout.CHK_RE.match(key) and not savepoint_only) or (
                key.startswith(f"{layout.SAVEPOINTS}/") and layout.SAVEPOINT_RE.match(key.split("/", 1)[1]))):
            raise RestoreError(
                f"{uri} is not a {'' if savepoint_only else 'checkpoint or '}savepoint directory of job "
                f"{self.job!r} ({self.uri}); expected {'' if savepoint_only else 'chk-<id> or '}"
                "savepoints/savepoint-<id>-<suffix> (see `sparkpoint list`)"
            )
        return key

    def key_of(self, uri: str) -> str:
        """The key, relative to the job root, of a URI, path or key naming something inside it.

        :raises InvalidPath: malformed, or contains ``..``/``.`` segments.
        :raises RestoreError: it points outside this job's root (another bucket, job or directory).
        """
        from airflow_sparkpoint.storage import split_uri

        if not isinstance(uri, str) or not uri.strip():
            raise InvalidPath(f"snapshot path {uri!r} is empty; expected a URI, a path or a key like chk-7")
        text = uri.strip()
        body = text.split("://", 1)[1] if "://" in text else text
        if any(part in (".", "..") for part in body.split("/")):
            raise InvalidPath(f"snapshot path {uri!r} contains '.' or '..' segments; give the path as listed")
        if "://" not in text and not text.startswith("/"):
            return normalize_key(text)  # a key relative to the job root
        scheme, bucket, path = split_uri(text)
        own_scheme, own_bucket, own_path = split_uri(self.uri)
        path, own_path = path.rstrip("/"), own_path.rstrip("/")
        if ((scheme, bucket) != (own_scheme, own_bucket)
                or not path.startswith(own_path + "/" if own_path else "")):
            raise RestoreError(f"{uri} is outside job {self.job!r} ({self.uri})")
        return normalize_key(path[len(own_path):].lstrip("/"))

    # ------------------------------------------------------------------ restore targets

    def snapshot(self, checkpoint_id: int) -> SnapshotHandle:
        """A handle on completed checkpoint `checkpoint_id`.

        :raises RestoreError: it is missing or invalid.
        """
        entry = self._read_entry(
            "checkpoint", checkpoint_id, layout.checkpoint_dir(checkpoint_id), self.shared_sizes(), ""
        )
        if entry.metadata is None:
            raise RestoreError(f"checkpoint {entry.uri} is not usable: {entry.error}")
        return SnapshotHandle(entry.uri, entry.metadata, self.store)

    def own_snapshot(self, uri: str) -> SnapshotHandle | None:
        """A handle on the checkpoint or savepoint of this job `uri` names, or None when
        `uri` is not a snapshot directory of this job's root (another root, a pin).

        :raises RestoreError: it is this job's and missing or invalid.
        """
        try:
            key = self.snapshot_key(uri)
        except (RestoreError, InvalidPath):
            return None
        match = layout.CHK_RE.match(key)
        if match:
            return self.snapshot(int(match.group(1)))
        entry = self.savepoint_entry(key.split("/", 1)[1])
        if entry is None or entry.metadata is None:
            raise RestoreError(f"savepoint {self.uri}/{key} is not usable: "
                               f"{entry.error if entry else 'not found'}")
        return SnapshotHandle(entry.uri, entry.metadata, self.store.child(entry.key))

    def handle(self, meta: SnapshotMetadata) -> SnapshotHandle:
        return SnapshotHandle(self.checkpoint_uri(meta.id), meta, self.store)

    def in_root(self, uri: str) -> bool:
        """Whether `uri` (a URI, path or key) names something inside this job's root."""
        try:
            self.key_of(uri)
        except (InvalidPath, RestoreError):
            return False
        return True

    def open_in_root(self, uri: str) -> SnapshotHandle:
        """The snapshot of this job's root that `uri` names (a checkpoint, a savepoint or a
        lineage's pin), read through this store: no other store is opened.

        :raises RestoreError: `uri` is malformed or outside the root, or not a valid
            snapshot (no valid ``_metadata``, a file missing).
        """
        try:
            key = self.key_of(uri)
        except InvalidPath as exc:
            raise RestoreError(str(exc)) from exc
        match = layout.CHK_RE.match(key)
        if match:
            return self.snapshot(int(match.group(1)))
        return open_snapshot(f"{self.uri}/{key}", store=self.store.child(key))

    def read_in_root(self, uri: str) -> SnapshotHandle:
        """`open_in_root` from the snapshot's ``_metadata`` alone, its files neither listed
        nor checked: one read, for a reader that judges only what the snapshot confirms.

        :raises RestoreError: there is no ``_metadata`` at `uri` (gone).
        :raises InvalidPath: `uri` is malformed or outside the root.
        :raises CorruptMetadata: it fails its checksum or schema.
        :raises StorageError: the store cannot be read.
        """
        key = self.key_of(uri)
        where = f"{self.uri}/{key}"
        try:
            meta = read_metadata(self.store, f"{key}/{layout.METADATA}", f"{where}/{layout.METADATA}")
        except ObjectNotFound:
            raise RestoreError(f"{where} has no _metadata") from None
        return SnapshotHandle(where, meta, self.store if layout.CHK_RE.match(key) else self.store.child(key))


def _integer(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"a JSON {type(raw).__name__}, not an integer")
    return raw
