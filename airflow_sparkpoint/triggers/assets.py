"""Event triggers for Airflow's `AssetWatcher`: a streaming job's new committed data and
its new savepoints, read from the job's catalog by the triggerer.

``SparkpointCommitTrigger``     one event each time the job's commit head moves
                                (`services.watches.commit_position`: written after a sink
                                confirmed a commit, never for staged or aborted batches); one
                                GET a poll
``SparkpointSavepointTrigger``  one event per new completed savepoint (``_metadata``
                                present); one LIST a poll, then the listing and ``_metadata``
                                of each directory not seen yet (all of them only when a
                                watcher starts without a cursor)

Both run for as long as the asset is watched: a store error is logged and polled again,
never the end of the trigger.

**Across triggerer restarts.** A watcher trigger is rebuilt from its kwargs, so its
position (the *cursor*: the commit head's ``seq`` and transaction, or the savepoints seen)
is kept in Airflow's asset state store (Airflow 3.3+: ``self.asset_state_store``, one key
per job and store under the watched asset). Airflow hands a yielded event to the
triggerer's main loop, which stores the asset event within a state sync (a second or
two); it gives a plain `run()` no acknowledgement. So the cursor of an event is saved at
the *next* poll, one `poll_interval` later: a triggerer that dies before that repeats
the event after its restart (at least once), and an event is lost only if the triggerer
had not stored it one poll interval after it was yielded. Every payload carries the
job, the generation, the batch and the head's ``seq`` (or the savepoint URI), so a
consumer dedupes. The first start of a watcher (no cursor) takes the present position as
its start: it reports what is committed after it, not the history. Without an asset
state store (Airflow before 3.3, or one trigger watching several assets) the cursor
lives in memory: commits made while no triggerer ran it are reported as one event
(``after_batch`` .. ``last_batch``) when the next commit comes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.services.stores import Catalog, validate_job_name
from airflow_sparkpoint.services.watches import commit_position, savepoint_position
from airflow_sparkpoint.triggers.shared import open_catalog, release_catalog, run_blocking

__all__ = ["SparkpointCommitTrigger", "SparkpointSavepointTrigger"]


class _CatalogWatchTrigger(BaseEventTrigger):
    """Poll a job's catalog forever; subclasses say what the position is and which
    events a move of it makes."""

    kind: ClassVar[str] = ""

    def __init__(self, *, job_name: str, checkpoint_dir: str | None = None,
                 sparkpoint_conn_id: str | None = None,
                 poll_interval: float | timedelta | str = 10.0) -> None:
        super().__init__()
        validate_job_name(job_name)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self.poll_interval = durations.seconds("poll_interval", poll_interval)
        self._store_key: str | None = None
        self._state_warned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"job_name": self.job_name, "checkpoint_dir": self.checkpoint_dir,
                 "sparkpoint_conn_id": self.sparkpoint_conn_id, "poll_interval": self.poll_interval})

    @property
    def cursor_key(self) -> str:
        """The key of this watcher's cursor in the asset state store: one per job and store."""
        where = hashlib.sha256(f"{self.sparkpoint_conn_id}|{self.checkpoint_dir}".encode()).hexdigest()[:16]
        return f"sparkpoint.{self.kind}.{self.job_name}.{where}"

    # ------------------------------------------------------------------ what subclasses say

    def position(self, catalog: Catalog, cursor: dict[str, Any] | None) -> dict[str, Any]:
        """The present position as a cursor (blocking; storage errors raise)."""
        raise NotImplementedError

    def events(self, before: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
        """The event payloads of a move from cursor `before` to position `now`, oldest first."""
        raise NotImplementedError

    def cursor_of(self, position: dict[str, Any]) -> dict[str, Any]:
        """What of a position is kept as the cursor (JSON, small)."""
        return position

    # ------------------------------------------------------------------ cursor

    @property
    def _state_store(self) -> Any:
        # Airflow 3.3 sets it before run() (3.2 has no such attribute); aget/aset came in 3.3.2.
        return getattr(self, "asset_state_store", None)

    async def load_cursor(self) -> dict[str, Any] | None:
        store = self._state_store
        if store is None:
            self._warn_state("Airflow gave the trigger no asset state store (Airflow 3.3+)")
            return None
        try:
            value = await store.aget(self.cursor_key, default=None)
        except ValueError as exc:  # several watched assets: no single accessor
            self._warn_state(f"no single watched asset ({exc})")
            return None
        except AttributeError:
            self._warn_state("this Airflow's asset state store has no async API (Airflow 3.3.2+)")
            return None
        return dict(value) if isinstance(value, dict) else None

    async def save_cursor(self, cursor: dict[str, Any]) -> None:
        store = self._state_store
        if store is None:
            self._warn_state("Airflow gave the trigger no asset state store (Airflow 3.3+)")
            return
        try:
            await store.aset(self.cursor_key, cursor)
        except (ValueError, AttributeError) as exc:
            self._warn_state(f"no usable asset state store ({exc})")
        except Exception as exc:  # noqa: BLE001 - the next poll saves again
            self.log.warning("could not save the cursor of the %s watcher of job %s: %s", self.kind,
                             self.job_name, exc)

    def _warn_state(self, why: str) -> None:
        if not self._state_warned:
            self._state_warned = True
            self.log.warning("the %s watcher of job %s keeps its cursor in memory: %s; "
                             "after a triggerer restart "
                             "it starts from the present position", self.kind, self.job_name, why)

    # ------------------------------------------------------------------ running

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self._store_key, catalog = await open_catalog(self.job_name, self.checkpoint_dir,
                                                      self.sparkpoint_conn_id)
        cursor = await self.load_cursor()
        unsaved: dict[str, Any] | None = None
        if cursor is None:
            start = await self._look(catalog, None)
            while start is None:
                await asyncio.sleep(self.poll_interval)
                start = await self._look(catalog, None)
            cursor = self.cursor_of(start)
            self.log.info("the %s watcher of job %s starts at %s", self.kind, self.job_name, cursor)
            await self.save_cursor(cursor)
        else:
            self.log.info("the %s watcher of job %s resumes at %s", self.kind, self.job_name, cursor)
        while True:
            if unsaved is not None:  # one poll after its events were handed over (module docstring)
                await self.save_cursor(unsaved)
                unsaved = None
            now = await self._look(catalog, cursor)
            if now is not None and self.cursor_of(now) != cursor:
                for payload in self.events(cursor, now):
                    yield TriggerEvent(payload)
                cursor = unsaved = self.cursor_of(now)
            await asyncio.sleep(self.poll_interval)

    async def _look(self, catalog: Catalog, cursor: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            return await run_blocking(self.position, catalog, cursor)
        except SparkpointError as exc:
            self.log.warning("the %s watcher of job %s could not read the store (polling again): %s",
                             self.kind, self.job_name, exc)
            return None

    async def cleanup(self) -> None:
        key, self._store_key = self._store_key, None
        await release_catalog(key)


class SparkpointCommitTrigger(_CatalogWatchTrigger):
    """One event each time a job commits new batches to its sink (for an `AssetWatcher`
    on the output asset, `airflow_sparkpoint.assets.sink_asset`).

    :param job_name: the pipeline.
    :param checkpoint_dir: storage root; or `sparkpoint_conn_id` (resolved in the triggerer).
    :param sparkpoint_conn_id: a ``sparkpoint`` connection.
    :param poll_interval: seconds between looks at the commit head (one GET each).

    Payload (the asset event's ``extra["payload"]``)::

        {"kind": "commit", "job": "orders", "generation": 5, "seq": 42,
         "after_batch": 15, "last_batch": 17, "txn_id": "orders-b17-g5",
         "sink": "delta:s3://b/t", "sink_version": 23, "committed_at": 1795307061.1}

    ``after_batch`` is the last batch the previous event reported (None after a
    restart without a saved cursor, or for the first event of a watcher).
    """

    kind = "commits"

    def position(self, catalog: Catalog, cursor: dict[str, Any] | None) -> dict[str, Any]:
        return commit_position(catalog)

    def events(self, before: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
        if now.get("txn_id") is None:  # the head record went away: nothing new was committed
            return []
        return [{"kind": "commit", "job": self.job_name, "generation": now.get("generation"),
                 "seq": now["seq"],
                 "after_batch": before.get("batch"), "last_batch": now["batch"], "txn_id": now["txn_id"],
                 "sink": now.get("sink"), "sink_version": now.get("sink_version"),
                 "committed_at": now.get("committed_at")}]


class SparkpointSavepointTrigger(_CatalogWatchTrigger):
    """One event per new completed savepoint of a job (for an `AssetWatcher` on its
    savepoints asset, `airflow_sparkpoint.assets.savepoints_asset`).

    Parameters as `SparkpointCommitTrigger`. Payload::

        {"kind": "savepoint", "job": "orders", "generation": 5, "batch": 17,
         "savepoint": "s3://b/root/orders/savepoints/savepoint-12-k3j2", "checkpoint_id": 12,
         "created_at": 1795307061.1}
    """

    kind = "savepoints"

    def position(self, catalog: Catalog, cursor: dict[str, Any] | None) -> dict[str, Any]:
        """`services.watches.savepoint_position`: one listing of ``savepoints/``, then the
        directories not seen yet."""
        return savepoint_position(catalog, cursor)

    def cursor_of(self, position: dict[str, Any]) -> dict[str, Any]:
        # About MAX_KNOWN_SAVEPOINTS names (more while an idle job takes savepoints: `services.watches`)
        cursor: dict[str, Any] = {"known": list(position.get("known", ()))}
        if position.get("floor") is not None:
            cursor["floor"] = position["floor"]
        return cursor

    def events(self, before: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
        seen = set(before.get("known", ()))
        details = now.get("details") or {}
        return [{"kind": "savepoint", "job": self.job_name, **details[name]}
                for name in now.get("fresh", ()) if name not in seen and name in details]
