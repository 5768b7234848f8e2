"""The storage protocol: where Sparkpoint's bytes live.

A `Storage` is rooted at a URI and addressed by *keys*: relative, ``/``-separated paths
with no ``..`` or empty segments. Every implementation offers the same small set of
operations so that the catalog above it never knows whether it talks to memory, a local
disk or S3.
"""

from __future__ import annotations

import abc
import builtins
import os
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from airflow_sparkpoint.exceptions import InvalidPath, ObjectTooLarge

__all__ = ["ObjectInfo", "ObjectTooLarge", "PrefixedStorage", "Storage", "check_size", "discard_file",
           "join_key", "normalize_key", "normalize_prefix"]


@dataclass(frozen=True)
class ObjectInfo:
    """What `stat` and `list` report about one object."""

    key: str
    size: int
    mtime: float  # seconds since the epoch
    etag: str | None = None


def discard_file(path: str) -> None:
    """Remove a temporary file if it is there (cleanup after a failed write)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def check_size(size: int, max_bytes: int | None, where: str) -> None:
    """Refuse an object of `size` bytes over `max_bytes` (None: no limit).

    :raises ObjectTooLarge: naming `where` (the object's path), its size and the limit.
    """
    if max_bytes is not None and size > max_bytes:
        raise ObjectTooLarge(f"{where} is {size} bytes, over the limit of {max_bytes} bytes for its kind of "
                             "record; treated as corrupt")


def normalize_key(key: str) -> str:
    """Return `key` in canonical form.

    :raises InvalidPath: the key is empty, absolute, or has ``..``/``.``/empty segments.
    """
    if not isinstance(key, str) or not key:
        raise InvalidPath(f"storage key {key!r} is empty; expected a relative path "
                          "like 'job/chk-1/_metadata'")
    stripped = key.strip("/")
    parts = stripped.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in stripped or "\x00" in stripped:
        raise InvalidPath(
            f"storage key {key!r} is not a plain relative path; expected segments without '..', '.' or '//'"
        )
    return stripped


def normalize_prefix(prefix: str) -> str:
    """Like `normalize_key` but the empty prefix (the whole store) is allowed; a
    non-empty result ends with ``/`` so that ``a/b`` never lists ``a/bc``."""
    if prefix in ("", "/"):
        return ""
    return normalize_key(prefix) + "/"


def join_key(*parts: str) -> str:
    """Join key segments and normalize the result."""
    return normalize_key(posixpath.join(*[p.strip("/") for p in parts if p]))


class Storage(abc.ABC):
    """A flat key/value object store with atomic create.

    Implementations must make `put` and `put_if_absent` atomic: a reader sees the whole
    old value, the whole new value, or nothing — never a partial object.
    """

    #: the URI the store is rooted at, e.g. ``file:///data/sp`` or ``s3://bucket/prefix``
    uri: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write `data` at `key`, replacing any existing object atomically."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create `key` with `data` only if it does not exist (atomic across processes).

        :raises ObjectExists: the key already exists (another writer won the race).
        """

    @abc.abstractmethod
    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Return the whole object; one larger than `max_bytes` is never read whole.

        :raises ObjectNotFound: no object at `key`.
        :raises ObjectTooLarge: it is larger than `max_bytes` (a ValueError: callers that
            treat unparsable records as corrupt treat it so too).
        """

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Return size and modification time of the object.

        :raises ObjectNotFound: no object at `key`.
        """

    def exists(self, key: str) -> bool:
        """Whether an object exists at `key`."""
        from airflow_sparkpoint.exceptions import ObjectNotFound

        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every object under `prefix` (recursively), lazily, sorted by key."""

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return the names of the immediate "sub-directories" under `prefix`.

        The default walks `list`; stores with a delimiter-aware listing override it.
        """
        base = normalize_prefix(prefix)
        names: set[str] = set()
        for info in self.list(prefix):
            rest = info.key[len(base):]
            if "/" in rest:
                names.add(rest.split("/", 1)[0])
        return sorted(names)

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete every key; missing keys are ignored."""

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; return how many were deleted."""
        keys = [info.key for info in self.list(prefix)]
        self.delete(keys)
        return len(keys)

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Copy an object within this store (server-side where the store can).

        :raises ObjectNotFound: `src` does not exist.
        """

    def locate(self, key: str) -> tuple[Storage, str]:
        """The store that really holds `key` and its key there (a view resolves to the
        store it views)."""
        return self, normalize_key(key)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        """Copy `key` of `source` to `target_key` without moving its bytes through this
        process, when both stores are one place (one filesystem: a hard link; one S3
        service: a server-side copy). Returns False, having written nothing, when they
        are not: the caller then transfers the bytes itself.

        :raises ObjectNotFound: `key` does not exist in `source`.
        """
        return False

    def upload_file(self, local_path: str, key: str) -> None:
        """Upload a local file to `key` (streamed where the store can)."""
        with open(local_path, "rb") as handle:
            self.put(key, handle.read())

    def download_file(self, key: str, local_path: str) -> None:
        """Download `key` into a local file, creating parent directories."""
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        data = self.get(key)
        tmp = f"{local_path}.sparkpoint-tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, local_path)

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        """Copy `key` into another store, streamed: through a temporary local file, never
        the whole object in memory (a store with local files overrides it).

        :raises ObjectNotFound: `key` does not exist.
        """
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix="sparkpoint-copy-")
        os.close(fd)
        try:
            self.download_file(key, tmp)
            target.upload_file(tmp, target_key)
        finally:
            discard_file(tmp)

    def child(self, prefix: str) -> Storage:
        """A view of this store rooted at `prefix` (keys are relative to it)."""
        return PrefixedStorage(self, prefix)

    def at(self, uri: str) -> Storage | None:
        """The store rooted at `uri` when it is on this store's own service, reached with
        this store's own options (S3: the same endpoint, credentials and client; the same
        local filesystem; the same process's memory buckets), else None (another scheme,
        or a store that cannot tell).

        :raises InvalidPath: `uri` is malformed.
        """
        return None

    def check(self) -> None:
        """Fail fast unless the store can be used (S3: the bucket exists and these
        credentials may use it). The default lists the root's top level.

        :raises StorageError: the store cannot be reached or read (a local store may
            raise `OSError`).
        """
        self.list_dirs("")

    def check_exclusive_create(self) -> None:
        """Fail fast unless `put_if_absent` refuses a second create of one key (generation
        and batch claims rest on it). The default trusts the store: local and in-memory
        stores create exclusively by construction.

        :raises StorageError: the store would let two creates of one key both succeed.
        """

    def close(self) -> None:
        """Release network clients or file handles."""


class PrefixedStorage(Storage):
    """A `Storage` view whose keys are relative to a prefix of another store."""

    def __init__(self, inner: Storage, prefix: str) -> None:
        self._inner = inner
        self._prefix = normalize_prefix(prefix)
        self.uri = inner.uri.rstrip("/") + "/" + self._prefix.rstrip("/")

    def _k(self, key: str) -> str:
        return self._prefix + normalize_key(key)

    def put(self, key: str, data: bytes) -> None:
        self._inner.put(self._k(key), data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._inner.put_if_absent(self._k(key), data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return self._inner.get(self._k(key), max_bytes)

    def stat(self, key: str) -> ObjectInfo:
        info = self._inner.stat(self._k(key))
        return ObjectInfo(key=normalize_key(key), size=info.size, mtime=info.mtime, etag=info.etag)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._prefix + normalize_prefix(prefix)
        for info in self._inner.list(full):
            yield ObjectInfo(info.key[len(self._prefix):], info.size, info.mtime, info.etag)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self._inner.list_dirs(self._prefix + normalize_prefix(prefix))

    def delete(self, keys: Iterable[str]) -> None:
        self._inner.delete(self._k(k) for k in keys)

    def copy(self, src: str, dst: str) -> None:
        self._inner.copy(self._k(src), self._k(dst))

    def upload_file(self, local_path: str, key: str) -> None:
        self._inner.upload_file(local_path, self._k(key))

    def download_file(self, key: str, local_path: str) -> None:
        self._inner.download_file(self._k(key), local_path)

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        self._inner.copy_to(self._k(key), target, target_key)

    def locate(self, key: str) -> tuple[Storage, str]:
        return self._inner.locate(self._k(key))

    def at(self, uri: str) -> Storage | None:
        return self._inner.at(uri)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        return self._inner.copy_from(source, key, self._k(target_key))

    def check(self) -> None:
        self._inner.check()

    def check_exclusive_create(self) -> None:
        self._inner.check_exclusive_create()

    def close(self) -> None:
        self._inner.close()
