"""What every Sparkpoint trigger of a triggerer process shares: the few threads its
storage calls run on, one storage client per store, the wait between two polls and how
many failed polls in a row end a wait (`next_wait`, `MAX_POLL_ERRORS`,
`MAX_LOOK_ERRORS`), and the check of a trigger event in an operator's
``execute_complete``.

Storage calls block; they run on `POOL_THREADS` threads shared by every Sparkpoint
trigger of the process, never on the event loop and never on its default executor, so a
slow or hung store holds neither the loop nor other triggers' threads. Triggers waiting
on one store share one storage client (one boto3 client, not one per sensor).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
from airflow_sparkpoint.services.conditions import JITTER
from airflow_sparkpoint.services.stores import Catalog, Storage, job_catalog, open_storage

__all__ = ["MAX_LOOK_ERRORS", "MAX_POLL_ERRORS", "POOL_THREADS", "SHARED_STORES", "check_event",
           "next_wait", "open_catalog", "release_catalog", "run_blocking"]

#: consecutive failed polls (an unreachable store) tolerated before a trigger gives up
MAX_POLL_ERRORS = 3
#: the same for a trigger following a run or a cutover (`SparkpointRunTrigger`,
#: `SparkpointCutoverTrigger`): giving up there reports a run that may be fine as dead, or
#: sends the cutover back to the worker, so the store gets three times the time a waiting
#: sensor gives it (a sensor's error is retried by the task's own retries)
MAX_LOOK_ERRORS = MAX_POLL_ERRORS * 3
#: threads for the storage calls of all Sparkpoint triggers of a process
POOL_THREADS = 4

T = TypeVar("T")


def next_wait(poll_interval: float, remaining: float | None, *, upwards_only: bool) -> float:
    """The wait before a trigger's next poll: `poll_interval` jittered by `JITTER`, never
    past `remaining` seconds (None: no bound), never below 0, so triggers started together
    spread out. `upwards_only` for a trigger whose budget is a ceiling (a run's or a
    cutover's looks: at most 12 store requests a minute, never more looks than that); a
    waiting sensor's (`SparkpointCheckpointTrigger`) is jittered either way (``±JITTER``,
    its documented average rate: the mean interval stays `poll_interval`)."""
    interval = poll_interval * random.uniform(1.0 if upwards_only else 1.0 - JITTER, 1.0 + JITTER)
    return interval if remaining is None else max(0.0, min(interval, remaining))


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the Sparkpoint triggers' threads (with the caller's context, as
    `asyncio.to_thread` does), leaving the event loop and its default executor free."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="sparkpoint-trigger")
        pool = _pool
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(pool, call)


class _SharedStores:
    """One `Storage` per store (URI and options) for all triggers of the process,
    counted: the last trigger to release it closes it. Keys are digests: the options
    may hold credentials."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[str, tuple[Storage, int]] = {}

    @staticmethod
    def key(uri: str, options: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps([uri, dict(options)], sort_keys=True,
                                         default=str).encode()).hexdigest()

    def acquire(self, uri: str, options: Mapping[str, Any]) -> tuple[str, Storage]:
        """The shared store for `uri` (opened here on first use: cheap, clients are lazy)."""
        key = self.key(uri, options)
        with self._lock:
            storage, users = self._stores.get(key) or (open_storage(uri, **options), 0)
            self._stores[key] = (storage, users + 1)
        return key, storage

    def release(self, key: str) -> Storage | None:
        """Drop one user of `key`; the store to close when it was the last, else None."""
        with self._lock:
            storage, users = self._stores[key]
            if users > 1:
                self._stores[key] = (storage, users - 1)
                return None
            del self._stores[key]
        return storage


SHARED_STORES = _SharedStores()


async def open_catalog(job_name: str, checkpoint_dir: str | None, sparkpoint_conn_id: str | None
                       ) -> tuple[str, Catalog]:
    """(the shared store's key for `release_catalog`, the job's catalog on it); the
    connection is read with Airflow's async API."""
    hook = SparkpointHook(sparkpoint_conn_id, storage_uri=checkpoint_dir)
    await hook.aresolve()
    key, storage = await run_blocking(SHARED_STORES.acquire, hook.storage_uri, hook.storage_options)
    return key, job_catalog(storage, job_name)


async def release_catalog(key: str | None) -> None:
    """Release a store `open_catalog` acquired (the last user closes its client)."""
    storage = SHARED_STORES.release(key) if key is not None else None
    if storage is not None:
        await run_blocking(storage.close)


def check_event(event: Any, *, required: Sequence[str]) -> dict[str, Any]:
    """The payload of a trigger event for ``execute_complete`` (without ``status``).

    :raises AirflowSensorTimeout: an error event for a timeout.
    :raises AirflowException: an error event, or a malformed one (not a dict, unknown
        status, a required key missing or empty).
    """
    if not isinstance(event, Mapping):
        raise AirflowException(
            f"malformed Sparkpoint trigger event {event!r}: expected a dict with status 'success' or 'error'"
        )
    status = event.get("status")
    if status == "error":
        message = event.get("message") or "the trigger reported an error without a message"
        if event.get("reason") == "timeout":
            raise AirflowSensorTimeout(str(message))
        raise AirflowException(str(message))
    if status != "success":
        raise AirflowException(
            f"malformed Sparkpoint trigger event {dict(event)!r}: status {status!r}, "
            "expected 'success' or 'error'"
        )
    missing = [key for key in required if event.get(key) in (None, "")]
    if missing:
        raise AirflowException(
            f"malformed Sparkpoint trigger event {dict(event)!r}: missing {', '.join(missing)}"
        )
    return {key: value for key, value in event.items() if key != "status"}
