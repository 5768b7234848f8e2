"""A `Storage` proxy that counts and logs the requests made through it.

Shipped like `MemoryStorage`: tests and benchmarks count what a checkpoint costs in
storage requests (deterministic, unlike timings on a shared machine). Each call is
counted once by operation and by the S3 request kind it stands for (a listing counts
once, whatever its pages; `delete` is one batch request).
"""

from __future__ import annotations

import builtins
import threading
from collections import Counter
from collections.abc import Iterable, Iterator

from airflow_sparkpoint.storage.base import ObjectInfo, Storage

__all__ = ["KIND_OF", "CountingStorage"]

#: the request kind each operation stands for (S3's names: HEAD is a stat, COPY server-side)
KIND_OF = {
    "get": "GET", "download_file": "GET",
    "stat": "HEAD", "exists": "HEAD",
    "put": "PUT", "put_if_absent": "PUT", "upload_file": "PUT",
    "list": "LIST", "list_dirs": "LIST",
    "delete": "DELETE",
    "copy": "COPY", "copy_from": "COPY",
}


class CountingStorage(Storage):
    """Counts (`calls` by operation, `kinds` by request kind) and logs (`log`:
    ``(operation, key)`` in call order) every request passed to `inner`. Thread-safe."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _note(self, op: str, key: str) -> None:
        with self._lock:
            self.calls[op] += 1
            self.log.append((op, key))

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.log.clear()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    @property
    def kinds(self) -> Counter[str]:
        with self._lock:
            counts: Counter[str] = Counter()
            for op, n in self.calls.items():
                counts[KIND_OF[op]] += n
            return counts

    def put(self, key: str, data: bytes) -> None:
        self._note("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._note("put_if_absent", key)
        self.inner.put_if_absent(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self._note("get", key)
        return self.inner.get(key, max_bytes)

    def stat(self, key: str) -> ObjectInfo:
        self._note("stat", key)
        return self.inner.stat(key)

    def exists(self, key: str) -> bool:
        self._note("exists", key)
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._note("list", prefix)
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._note("list_dirs", prefix)
        return self.inner.list_dirs(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        keys = builtins.list(keys)
        if keys:  # the stores send nothing for an empty batch
            self._note("delete", keys[0] if len(keys) == 1 else f"{keys[0]} (+{len(keys) - 1})")
        self.inner.delete(keys)

    def delete_prefix(self, prefix: str) -> int:
        keys = [info.key for info in self.list(prefix)]
        self.delete(keys)
        return len(keys)

    def copy(self, src: str, dst: str) -> None:
        self._note("copy", dst)
        self.inner.copy(src, dst)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        copied = self.inner.copy_from(source, key, target_key)
        if copied:
            self._note("copy_from", target_key)
        return copied

    def upload_file(self, local_path: str, key: str) -> None:
        self._note("upload_file", key)
        self.inner.upload_file(local_path, key)

    def download_file(self, key: str, local_path: str) -> None:
        self._note("download_file", key)
        self.inner.download_file(key, local_path)

    def locate(self, key: str) -> tuple[Storage, str]:
        return self.inner.locate(key)

    def check(self) -> None:
        self.inner.check()

    def check_exclusive_create(self) -> None:
        self.inner.check_exclusive_create()

    def close(self) -> None:
        self.inner.close()
