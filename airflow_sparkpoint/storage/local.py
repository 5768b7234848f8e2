"""Local-filesystem `Storage`: temp file + fsync + `os.replace`, atomic create via `os.link`."""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator

from airflow_sparkpoint.exceptions import InvalidPath, ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage.base import (
    ObjectInfo,
    Storage,
    check_size,
    discard_file,
    normalize_key,
    normalize_prefix,
)

_TMP_MARK = ".sparkpoint-tmp-"


class LocalStorage(Storage):
    """Objects are files under `root`. Writes go to a temp file that is fsynced and then
    renamed into place, so readers never see partial objects; `put_if_absent` links the
    temp file to the final name, which fails atomically if the name exists — safe across
    processes on POSIX filesystems.

    No symbolic link below `root` is followed (a writer of the store could plant one to
    anywhere): an object behind one does not exist for reads, listings and deletes, and
    a write through one is refused."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *normalize_key(key).split("/"))

    def _link_in(self, path: str) -> str | None:
        """The first symbolic link on `path` below the root (`path` itself included), or None."""
        current = self.root
        for part in os.path.relpath(path, self.root).split(os.sep):
            if part in ("", "."):
                continue
            current = os.path.join(current, part)
            try:
                if stat.S_ISLNK(os.lstat(current).st_mode):
                    return current
            except (FileNotFoundError, NotADirectoryError):
                return None
        return None

    def _read_path(self, key: str) -> str:
        """The file of `key` for reading.

        :raises ObjectNotFound: it is behind a symbolic link (not an object of this store).
        """
        path = self._path(key)
        link = self._link_in(path)
        if link is not None:
            raise ObjectNotFound(f"{path} is behind the symbolic link {link}; the store follows none")
        return path

    def _write_path(self, key: str) -> str:
        """The file of `key` for writing.

        :raises InvalidPath: it is behind a symbolic link (the write would land elsewhere).
        """
        path = self._path(key)
        link = self._link_in(path)
        if link is not None:
            raise InvalidPath(f"cannot write {path}: it is behind the symbolic link {link}; the store follows none")
        return path

    def _write_tmp(self, path: str, data: bytes) -> str:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f"{_TMP_MARK}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            discard_file(tmp)  # a torn temp file on a full disk would only make it fuller
            raise
        return tmp

    def _fsync_dir(self, directory: str) -> None:
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        path = self._write_path(key)
        tmp = None
        try:
            tmp = self._write_tmp(path, data)
            os.replace(tmp, path)
            tmp = None
            self._fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        finally:
            if tmp is not None:
                discard_file(tmp)

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._write_path(key)
        try:
            tmp = self._write_tmp(path, data)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExists(f"{path} already exists") from None
        except OSError as exc:
            raise StorageError(f"cannot create {path}: {exc}") from exc
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._fsync_dir(os.path.dirname(path))

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        path = self._read_path(key)
        try:
            with open(path, "rb") as handle:
                check_size(os.fstat(handle.fileno()).st_size, max_bytes, path)
                data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
                check_size(len(data), max_bytes, path)  # grew since the fstat
                return data
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"{path} does not exist") from None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def stat(self, key: str) -> ObjectInfo:
        path = self._read_path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"{path} does not exist") from None
        if not os.path.isfile(path):
            raise ObjectNotFound(f"{path} is not a file")
        return ObjectInfo(key=normalize_key(key), size=st.st_size, mtime=st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = normalize_prefix(prefix)
        start = os.path.join(self.root, *base.rstrip("/").split("/")) if base else self.root
        if not os.path.isdir(start) or self._link_in(start) is not None:
            return
        yield from self._walk(start, base)

    def _walk(self, directory: str, key_prefix: str) -> Iterator[ObjectInfo]:
        try:
            # Sort as full keys sort: a directory "a" lists as "a/...", after "a-b".
            entries = sorted(
                os.scandir(directory), key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name
            )
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith(_TMP_MARK):
                continue
            key = key_prefix + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    yield from self._walk(entry.path, key + "/")
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat()
                    yield ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)
            except FileNotFoundError:  # deleted while we listed
                continue

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        base = normalize_prefix(prefix)
        start = os.path.join(self.root, *base.rstrip("/").split("/")) if base else self.root
        if self._link_in(start) is not None:
            return []
        try:
            return sorted(e.name for e in os.scandir(start) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def delete(self, keys: Iterable[str]) -> None:
        paths = [self._path(key) for key in keys]  # validate every key before deleting any
        for path in paths:
            if self._link_in(os.path.dirname(path)) is not None:
                continue  # an object behind a link is not this store's (the link itself is)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StorageError(f"cannot delete {path}: {exc}") from exc
            self._prune_empty_dirs(os.path.dirname(path))

    def _prune_empty_dirs(self, directory: str) -> None:
        while directory.startswith(self.root + os.sep):
            try:
                os.rmdir(directory)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    return
                return
            directory = os.path.dirname(directory)

    def copy(self, src: str, dst: str) -> None:
        src_path, dst_path = self._read_path(src), self._write_path(dst)
        if not os.path.isfile(src_path):
            raise ObjectNotFound(f"{src_path} does not exist")
        self.upload_file(src_path, dst)
        del dst_path

    def upload_file(self, local_path: str, key: str) -> None:
        path = self._write_path(key)
        directory = os.path.dirname(path)
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f"{_TMP_MARK}{uuid.uuid4().hex}")
            shutil.copyfile(local_path, tmp)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            tmp = None
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{local_path} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        finally:
            if tmp is not None:
                discard_file(tmp)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        """A hard link when `source` is a local store on the same filesystem: stored
        objects are never written in place (every write is a new file renamed over the
        name), so two names of one file stay two immutable objects."""
        store, source_key = source.locate(key)
        if not isinstance(store, LocalStorage):
            return False
        src, path = store._read_path(source_key), self._write_path(target_key)
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f"{_TMP_MARK}{uuid.uuid4().hex}")
        try:
            os.makedirs(directory, exist_ok=True)
            os.link(src, tmp)
        except FileNotFoundError:
            if not os.path.isfile(src):
                raise ObjectNotFound(f"{src} does not exist") from None
            return False
        except OSError:  # another filesystem (EXDEV), links not allowed here
            return False
        try:
            os.replace(tmp, path)
            self._fsync_dir(directory)
        except OSError as exc:
            discard_file(tmp)
            raise StorageError(f"cannot write {path}: {exc}") from exc
        return True

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        """Streamed from the file itself (no temporary copy)."""
        path = self._read_path(key)
        if not os.path.isfile(path):
            raise ObjectNotFound(f"{path} does not exist")
        target.upload_file(path, target_key)

    def download_file(self, key: str, local_path: str) -> None:
        src = self._read_path(key)
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        tmp = f"{local_path}{_TMP_MARK}{uuid.uuid4().hex}"
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, local_path)
        except FileNotFoundError:
            discard_file(tmp)
            raise ObjectNotFound(f"{src} does not exist") from None
        except BaseException:
            discard_file(tmp)
            raise

