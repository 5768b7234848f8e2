"""`Storage` wrappers that make every call a scheduling point (`scheduler.Scheduler.point`)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from typing import Any

from airflow_sparkpoint.storage.base import ObjectInfo, Storage
from tests.simulation.scheduler import Scheduler


class YieldingStorage(Storage):
    """`inner`, with a point before every call. Listings are taken whole at the call (a
    paginated listing of a real store is not atomic either; one point per call keeps
    schedules short)."""

    def __init__(self, inner: Storage, scheduler: Scheduler, label: str) -> None:
        self.inner = inner
        self.scheduler = scheduler
        self.label = label
        self.uri = inner.uri

    def _point(self, op: str, key: str = "") -> None:
        self.scheduler.point(f"{self.label}.{op} {key}".rstrip())

    def put(self, key: str, data: bytes) -> None:
        self._point("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._point("put_if_absent", key)
        self.inner.put_if_absent(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self._point("get", key)
        return self.inner.get(key, max_bytes)

    def stat(self, key: str) -> ObjectInfo:
        self._point("stat", key)
        return self.inner.stat(key)

    def exists(self, key: str) -> bool:
        self._point("exists", key)
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._point("list", prefix)
        return iter(builtins.list(self.inner.list(prefix)))

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._point("list_dirs", prefix)
        return self.inner.list_dirs(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        keys = builtins.list(keys)
        if keys:
            self._point("delete", keys[0] + (f" (+{len(keys) - 1})" if len(keys) > 1 else ""))
        self.inner.delete(keys)

    def delete_prefix(self, prefix: str) -> int:
        self._point("delete_prefix", prefix)
        return self.inner.delete_prefix(prefix)

    def copy(self, src: str, dst: str) -> None:
        self._point("copy", f"{src} -> {dst}")
        self.inner.copy(src, dst)

    def upload_file(self, local_path: str, key: str) -> None:
        self._point("upload", key)
        self.inner.upload_file(local_path, key)

    def download_file(self, key: str, local_path: str) -> None:
        self._point("download", key)
        self.inner.download_file(key, local_path)

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        self._point("copy_to", f"{key} -> {target_key}")
        self.inner.copy_to(key, target, target_key)

    def child(self, prefix: str) -> Storage:
        return YieldingStorage(self.inner.child(prefix), self.scheduler, self.label)

    def locate(self, key: str) -> tuple[Storage, str]:
        return self.inner.locate(key)

    def at(self, uri: str) -> Storage | None:
        moved = self.inner.at(uri)
        return None if moved is None else YieldingStorage(moved, self.scheduler, self.label)

    def copy_from(self, source: Storage, key: str, target_key: str) -> bool:
        self._point("copy_from", f"{key} -> {target_key}")
        return self.inner.copy_from(source, key, target_key)

    def check(self) -> None:
        self.inner.check()

    def check_exclusive_create(self) -> None:
        self.inner.check_exclusive_create()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
