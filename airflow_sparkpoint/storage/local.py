"""Local-filesystem `Storage`: temp file + fsync + rename, atomic create by a hard link;
every path below the root reached through `localfs` (no link followed, no FIFO read)."""

from __future__ import annotations

import builtins
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from airflow_sparkpoint.exceptions import InvalidPath, ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage.base import ObjectInfo, Storage, normalize_key, normalize_prefix
from airflow_sparkpoint.storage.localfs import TMP_MARK, Dir, open_path
from airflow_sparkpoint.storage.uri import split_uri

__all__ = ["LocalStorage"]


class LocalStorage(Storage):
    """Objects are files under `root`. Writes go to a temp file that is fsynced and then
    renamed into place, so readers never see partial objects; `put_if_absent` links the
    temp file to the final name, which fails atomically if the name exists — safe across
    processes on POSIX filesystems.

    No symbolic link below `root` is followed (a writer of the store could plant one to
    anywhere): an object behind one does not exist for reads, listings and deletes, and
    a write through one is refused. Only regular files are objects: a FIFO planted under
    a key is not read (it cannot block the reader). Every path is reached from the root's
    descriptor (`localfs.Dir`), so nothing can be swapped between a check and the open.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root

    def at(self, uri: str) -> Storage | None:
        """The directory `uri` names on this (the local) filesystem, or None for another
        scheme."""
        scheme, _bucket, path = split_uri(uri)
        return LocalStorage(path) if scheme == "file" else None

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *normalize_key(key).split("/"))

    def _dir(self, create: bool = False) -> Dir:
        """The root, open (created when `create`).

        :raises FileNotFoundError: it does not exist.
        """
        return Dir.open(self.root, create=create)

    def _refused_write(self, key: str, exc: InvalidPath) -> InvalidPath:
        return InvalidPath(f"cannot write {self._path(key)}: {exc}; the store follows none")

    def put(self, key: str, data: bytes) -> None:
        key = normalize_key(key)
        try:
            with self._dir(create=True) as root:
                root.write(key, data)
        except InvalidPath as exc:
            raise self._refused_write(key, exc) from None
        except OSError as exc:
            raise StorageError(f"cannot write {self._path(key)}: {exc}") from exc

    def put_if_absent(self, key: str, data: bytes) -> None:
        key = normalize_key(key)
        try:
            with self._dir(create=True) as root:
                root.create(key, data)
        except FileExistsError:
            raise ObjectExists(f"{self._path(key)} already exists") from None
        except InvalidPath as exc:
            raise self._refused_write(key, exc) from None
        except OSError as exc:
            raise StorageError(f"cannot create {self._path(key)}: {exc}") from exc

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        key = normalize_key(key)
        path = self._path(key)
        try:
            with self._dir() as root:
                return root.read(key, sys.maxsize if max_bytes is None else max_bytes)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"{path} does not exist") from None
        except InvalidPath as exc:  # a link or a FIFO: not an object of this store
            raise ObjectNotFound(f"{path} is not an object: {exc}") from None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def stat(self, key: str) -> ObjectInfo:
        key = normalize_key(key)
        path = self._path(key)
        try:
            with self._dir() as root:
                st = root.stat(key)
        except FileNotFoundError:
            st = None
        except InvalidPath as exc:
            raise ObjectNotFound(f"{path} is not an object: {exc}") from None
        if st is None:
            raise ObjectNotFound(f"{path} does not exist")
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(f"{path} is not a file")
        return ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = normalize_prefix(prefix)
        try:
            root = self._dir()
        except FileNotFoundError:
            return
        with root:
            try:
                start = root.sub(base.rstrip("/")) if base else root.sub("")
            except (FileNotFoundError, NotADirectoryError, InvalidPath):
                return
            with start:
                yield from self._walk(start, base)

    def _walk(self, directory: Dir, key_prefix: str) -> Iterator[ObjectInfo]:
        # Sort as full keys sort: a directory "a" lists as "a/...", after "a-b".
        entries = sorted(directory.entries(),
                         key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name)
        for entry in entries:
            if entry.name.startswith(TMP_MARK):
                continue
            key = key_prefix + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    with directory.sub(entry.name) as child:
                        yield from self._walk(child, key + "/")
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    yield ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)
            except (FileNotFoundError, NotADirectoryError, InvalidPath):  # changed while we listed
                continue

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        base = normalize_prefix(prefix)
        try:
            with self._dir() as root:
                return root.subdirs(base.rstrip("/"))
        except (FileNotFoundError, InvalidPath):
            return []

    def delete(self, keys: Iterable[str]) -> None:
        wanted = [normalize_key(key) for key in keys]  # validate every key before deleting any
        if not wanted:
            return
        try:
            root = self._dir()
        except FileNotFoundError:
            return
        with root:
            for key in wanted:
                try:
                    root.unlink(key, prune_to="")
                except InvalidPath:
                    continue  # an object behind a link is not this store's (the link itself is)
                except OSError as exc:
                    raise StorageError(f"cannot delete {self._path(key)}: {exc}") from exc

    def copy(self, src: str, dst: str) -> None:
        src, dst = normalize_key(src), normalize_key(dst)
        try:
            with self._dir(create=True) as root:
                handle, _st = self._open(root, src)
                with handle:
                    root.write(dst, handle, sync_dir=False)
        except InvalidPath as exc:
            raise self._refused_write(dst, exc) from None
        except OSError as exc:
            raise StorageError(f"cannot write {self._path(dst)}: {exc}") from exc

    def _open(self, root: Dir, key: str) -> tuple[BinaryIO, os.stat_result]:
        """The object `key` open for reading.

        :raises ObjectNotFound: it is missing, behind a link or not a regular file.
        """
        try:
            return root.open_file(key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"{self._path(key)} does not exist") from None
        except InvalidPath as exc:
            raise ObjectNotFound(f"{self._path(key)} is not an object: {exc}") from None

    def upload_file(self, local_path: str, key: str) -> None:
        key = normalize_key(key)
        try:
            handle, _st = open_path(local_path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFound(f"{local_path} does not exist") from exc
        except InvalidPath as exc:
            raise ObjectNotFound(f"{local_path} is not a file to upload: {exc}") from None
        with handle:
            self._write_from(handle, key)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        """A hard link when `source` is a local store on the same filesystem: stored
        objects are never written in place (every write is a new file renamed over the
        name), so two names of one file stay two immutable objects."""
        store, source_key = source.locate(key)
        if not isinstance(store, LocalStorage):
            return False
        source_key, target_key = normalize_key(source_key), normalize_key(target_key)
        try:
            src_root = store._dir()
        except FileNotFoundError:
            raise ObjectNotFound(f"{store._path(source_key)} does not exist") from None
        with src_root:
            try:
                with self._dir(create=True) as root:
                    if src_root.link_to(source_key, root, target_key, replace=True, sync=True) is None:
                        if not src_root.is_file(source_key):
                            raise ObjectNotFound(f"{store._path(source_key)} does not exist")
                        return False  # another filesystem (EXDEV), links not allowed here
            except InvalidPath as exc:
                raise self._refused_write(target_key, exc) from None
            except OSError as exc:
                raise StorageError(f"cannot write {self._path(target_key)}: {exc}") from exc
        return True

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        """Streamed from the file itself (no temporary copy); into a local store through
        the open file."""
        key = normalize_key(key)
        try:
            root = self._dir()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self._path(key)} does not exist") from None
        with root:
            if isinstance(target, LocalStorage):
                handle, _st = self._open(root, key)
                with handle:
                    target._write_from(handle, target_key)
                return
            if not root.is_file(key):
                raise ObjectNotFound(f"{self._path(key)} does not exist (or is not a regular file reached "
                                     "without a link)")
        target.upload_file(self._path(key), target_key)

    def _write_from(self, handle: BinaryIO, key: str) -> None:
        key = normalize_key(key)
        try:
            with self._dir(create=True) as root:
                root.write(key, handle, sync_dir=False)
        except InvalidPath as exc:
            raise self._refused_write(key, exc) from None
        except OSError as exc:
            raise StorageError(f"cannot write {self._path(key)}: {exc}") from exc

    def download_file(self, key: str, local_path: str) -> None:
        key = normalize_key(key)
        directory, name = os.path.split(os.path.abspath(local_path))
        try:
            root = self._dir()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self._path(key)} does not exist") from None
        with root:
            handle, _st = self._open(root, key)
            with handle, Dir.open(directory, create=True) as target:
                target.write(name, handle, fsync=False)
