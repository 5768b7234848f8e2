"""An in-memory `Storage`: shipped for tests, users' tests and dry runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import ClassVar

from airflow_sparkpoint.exceptions import ObjectExists, ObjectNotFound
from airflow_sparkpoint.storage.base import ObjectInfo, Storage, check_size, normalize_key, normalize_prefix
from airflow_sparkpoint.storage.uri import split_uri

__all__ = ["MemoryStorage"]


class MemoryStorage(Storage):
    """A thread-safe dict of bytes. Stores with the same `name` share their contents
    within one process (``memory://name``), like pyiceberg's `InMemoryCatalog`, and the
    one lock that guards them (so `put_if_absent` is atomic across instances)."""

    _registry: ClassVar[dict[str, tuple[dict[str, tuple[bytes, float]], threading.Lock]]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "default") -> None:
        self.uri = f"memory://{name}"
        with self._registry_lock:
            self._objects, self._lock = self._registry.setdefault(name, ({}, threading.Lock()))

    def at(self, uri: str) -> Storage | None:
        """The memory bucket `uri` names (every memory bucket of this process is one
        service), or None for another scheme."""
        scheme, bucket, path = split_uri(uri)
        if scheme != "memory":
            return None
        store: Storage = MemoryStorage(bucket)
        return store.child(path) if path else store

    def put(self, key: str, data: bytes) -> None:
        key = normalize_key(key)
        with self._lock:
            self._objects[key] = (bytes(data), time.time())

    def put_if_absent(self, key: str, data: bytes) -> None:
        key = normalize_key(key)
        with self._lock:
            if key in self._objects:
                raise ObjectExists(f"{self.uri}/{key} already exists")
            self._objects[key] = (bytes(data), time.time())

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        key = normalize_key(key)
        with self._lock:
            try:
                data = self._objects[key][0]
            except KeyError:
                raise ObjectNotFound(f"{self.uri}/{key} does not exist") from None
        check_size(len(data), max_bytes, f"{self.uri}/{key}")
        return data

    def stat(self, key: str) -> ObjectInfo:
        key = normalize_key(key)
        with self._lock:
            try:
                data, mtime = self._objects[key]
            except KeyError:
                raise ObjectNotFound(f"{self.uri}/{key} does not exist") from None
        return ObjectInfo(key=key, size=len(data), mtime=mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = normalize_prefix(prefix)
        with self._lock:
            items = sorted((k, v) for k, v in self._objects.items() if k.startswith(base))
        for key, (data, mtime) in items:
            yield ObjectInfo(key=key, size=len(data), mtime=mtime)

    def delete(self, keys: Iterable[str]) -> None:
        normalized = [normalize_key(k) for k in keys]
        with self._lock:
            for key in normalized:
                self._objects.pop(key, None)

    def copy(self, src: str, dst: str) -> None:
        self.put(dst, self.get(src))

    @classmethod
    def reset(cls, name: str | None = None) -> None:
        """Forget the contents of one named store, or of all of them."""
        with cls._registry_lock:
            for key, (objects, lock) in cls._registry.items():
                if name is None or key == name:
                    with lock:
                        objects.clear()
