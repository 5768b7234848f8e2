"""One simulated world: a store in memory, a sink in a temporary directory, the input
files, the work directory, and the patches that put the product's real code under the
scheduler (every storage and sink call a point, virtual time, no helper threads, the
model instead of Spark)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import Catalog, transfer
from airflow_sparkpoint.checkpoints import snapshot_open as targets_module
from airflow_sparkpoint.runtime import checkpointer as checkpointer_module
from airflow_sparkpoint.runtime import executor_reach, replay, run_startup
from airflow_sparkpoint.runtime import prestore as prestore_module
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.storage import MemoryStorage, Storage, split_uri
from airflow_sparkpoint.storage.local import LocalStorage
from tests.simulation.inline import InlineExecutor, InlineThread
from tests.simulation.model import DELTA_KINDS, SimDeltaSink, SimDirectorySink, write_inputs
from tests.simulation.scheduler import Scheduler, virtual_time
from tests.simulation.storage import YieldingStorage

JOB = "sim"
#: the worlds' directories live in memory where the system has a tmpfs: the product's
#: fsyncs and a world's creation and removal then wait for no disk (a schedule's crashes
#: are process deaths, never a lost machine, so durability plays no part in it)
_MEMORY_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class Writes:
    """Which actor wrote which key (store and sink claims), for "a refused start changed
    nothing"."""

    by_actor: dict[str, list[str]] = field(default_factory=dict)
    #: every write in order: (actor, what)
    ordered: list[tuple[str, str]] = field(default_factory=list)

    def note(self, actor: str | None, what: str) -> None:
        if actor is not None:
            self.by_actor.setdefault(actor, []).append(what)
            self.ordered.append((actor, what))

    def index(self, actor: str, prefix: str) -> int | None:
        """The position of `actor`'s first write starting with `prefix`, or None."""
        return next((i for i, (a, w) in enumerate(self.ordered) if a == actor and w.startswith(prefix)), None)


class World:
    """Everything one schedule runs in (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, *, sink_kind: str, inputs: int) -> None:
        self.scheduler = scheduler
        self.sink_kind = sink_kind
        self.tmp = tempfile.mkdtemp(prefix="sparkpoint-sim-", dir=_MEMORY_TMP)
        self.store_name = f"sim-{uuid.uuid4().hex[:12]}"
        self.root = f"memory://{self.store_name}"
        self.work = os.path.join(self.tmp, "work")
        self.output = os.path.join(self.tmp, "out")
        self.outside = os.path.join(self.tmp, "outside")
        os.makedirs(self.work)
        os.makedirs(self.outside)
        with open(os.path.join(self.outside, "canary.txt"), "w", encoding="utf-8") as handle:
            handle.write("outside every root\n")
        self.inputs = write_inputs(os.path.join(self.tmp, "input"), inputs)
        self.writes = Writes()
        #: a start was refused after its origin in the documented window: the end may need
        #: a person's restore of another snapshot (`simulate._repair`)
        self.repair_allowed = False
        #: the sink's files the check after a step last passed on (`model.visible_signature`)
        self.checked_rows: tuple[Any, ...] | None = None
        self._reader: Sink | None = None
        #: blue's final savepoints that a savepoint history retention actor disposed of
        #: once the rule let it: another lineage than the cutover green's was the newest
        #: (`actors.savepoint_retention`, checked by `actors.check_final_savepoint`)
        self.final_savepoints_released: set[str] = set()
        #: cutover greens rolled back to blue's final savepoint: generation -> N (none of
        #: their batches may be in the sink at the end)
        self.green_rolled_back: dict[int, int] = {}

    # -- the places ----------------------------------------------------------------------

    def storage(self, label: str = "store") -> Storage:
        return _TrackingStorage(MemoryStorage(self.store_name), self, label)

    def catalog(self) -> Catalog:
        return Catalog(self.storage(), JOB)

    def raw_catalog(self) -> Catalog:
        """The store without points: the harness's own reads."""
        return Catalog(MemoryStorage(self.store_name), JOB)

    def sink(self) -> Sink:
        """A fresh sink object on the world's output (every actor is its own process)."""
        sink: Any
        if self.sink_kind in DELTA_KINDS:
            sink = self._delta_sink()
        else:
            sink = SimDirectorySink(self.output, format="json")
        sink.sim_point = self.scheduler.point
        return self._points_on(sink)

    def raw_sink(self) -> Sink:
        """The sink without points: the harness's own reads."""
        if self.sink_kind in DELTA_KINDS:
            return self._delta_sink()
        return SimDirectorySink(self.output, format="json")

    def _delta_sink(self) -> SimDeltaSink:
        if self.sink_kind == "delta-merge":
            # (batch, line) names one input row: a merge of a batch twice is invisible in
            # the rows, a lost or foreign batch is not (its values and sums differ)
            return SimDeltaSink(self.output, mode="merge", keys=["batch", "line"])
        return SimDeltaSink(self.output)

    def reader_sink(self) -> Sink:
        """One raw sink for the harness's reads after every step (reading keeps no state in it)."""
        if self._reader is None:
            self._reader = self.raw_sink()
        return self._reader

    def _points_on(self, sink: Any) -> Sink:
        """A point at every sink call (instance attributes: the class, which records name
        as their settler, stays the sink's own) and under its claims' storage."""
        for name in ("commit", "abort", "is_committed", "committed_position", "rewind", "cleanup_orphans",
                     "committed_txn", "replay_record"):
            method = getattr(sink, name)
            setattr(sink, name, _pointed(self.scheduler, f"sink.{name}", method))
        if isinstance(sink, SimDirectorySink):
            sink._store = _TrackingStorage(LocalStorage(sink._local), self, "sink")
        else:
            inner = sink.location.store

            def store() -> Storage:
                return _TrackingStorage(inner(), self, "sink")

            sink.location.store = store
        return sink

    def outside_digest(self) -> str:
        digest = hashlib.sha256()
        for directory, _dirs, files in sorted(os.walk(self.outside)):
            for name in sorted(files):
                path = os.path.join(directory, name)
                digest.update(path.encode())
                with open(path, "rb") as handle:
                    digest.update(handle.read())
        return digest.hexdigest()

    def close(self) -> None:
        MemoryStorage.reset(self.store_name)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the patches -------------------------------------------------------------------

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        sched = self.scheduler

        def open_storage(uri: str, **options: Any) -> Storage:
            scheme, bucket, path = split_uri(uri)
            if scheme != "memory":
                raise AssertionError(f"the simulation opened a non-memory store {uri!r}")
            store: Storage = MemoryStorage(bucket)
            if path:
                store = store.child(path)
            return _TrackingStorage(store, self, "store")

        def maybe_kill(point: str, batch_id: int) -> None:
            sched.point(f"fault {point}:{batch_id}")

        def maybe_kill_halfway(point: str, batch_id: int, done: int, total: int) -> None:
            if done == max(1, total // 2):
                sched.point(f"fault {point}:{batch_id} (halfway)")

        def pause(point: str, batch_id: int | None = None, **details: object) -> bool:
            sched.point(f"pause {point}:{batch_id}")
            return False

        def run_batch(spark: Any, df: Any, output_mode: str, live_root: str, batch: int) -> None:
            df.live = live_root  # the replay runs during the start, before the query does
            df.replay(batch)

        threads = types.SimpleNamespace(Thread=InlineThread, Event=threading.Event, Lock=threading.Lock)
        with contextlib.ExitStack() as stack:
            stack.enter_context(_warnings_into(sched))
            stack.enter_context(virtual_time(sched.clock))
            for target, name, value in (
                (targets_module, "open_storage", open_storage),
                (run_startup, "open_storage", open_storage),
                (faults, "maybe_kill", maybe_kill),
                (faults, "maybe_kill_halfway", maybe_kill_halfway),
                (faults, "pause", pause),
                (faults, "armed", lambda point: False),
                (executor_reach, "check_executors_reach", lambda spark, root: None),
                (replay, "run_batch", run_batch),
                (transfer, "ThreadPoolExecutor", InlineExecutor),
                (checkpointer_module, "ThreadPoolExecutor", InlineExecutor),
                (prestore_module, "threading", threads),
            ):
                stack.enter_context(mock.patch.object(target, name, value))
            stack.callback(sched.close)  # first, under the patches: actors a violation left waiting die
            yield


@contextlib.contextmanager
def _warnings_into(scheduler: Scheduler) -> Iterator[None]:
    """The product's warnings go into the trace, under the actor that logged them (and
    nowhere else while the schedule runs)."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            actor = scheduler.current()
            scheduler.trace.append(f"          {actor.name if actor else 'harness'} "
                                   f"{record.levelname.lower()}: {record.getMessage()}"[:300])

    logger = logging.getLogger("airflow_sparkpoint")
    handler = Handler(logging.WARNING)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _pointed(scheduler: Scheduler, label: str, method: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        record = args[0] if args else None
        txn = getattr(record, "txn_id", None)
        scheduler.point(f"{label} {txn or (args[0] if args else '')}".rstrip())
        return method(*args, **kwargs)

    return call


class _TrackingStorage(YieldingStorage):
    """A point at every call, and every write noted under the actor that made it."""

    def __init__(self, inner: Storage, world: World, label: str) -> None:
        super().__init__(inner, world.scheduler, label)
        self.world = world

    def _note(self, op: str, key: str) -> None:
        actor = self.scheduler.current()
        self.world.writes.note(actor.name if actor is not None else None, f"{self.label}:{op} {key}")

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self._note("put", key)

    def put_if_absent(self, key: str, data: bytes) -> None:
        super().put_if_absent(key, data)
        self._note("put_if_absent", key)

    def delete(self, keys: Any) -> None:
        keys = list(keys)
        super().delete(keys)
        for key in keys:
            self._note("delete", key)

    def delete_prefix(self, prefix: str) -> int:
        count = super().delete_prefix(prefix)
        if count:
            self._note("delete_prefix", prefix)
        return count

    def copy(self, src: str, dst: str) -> None:
        super().copy(src, dst)
        self._note("copy", dst)

    def upload_file(self, local_path: str, key: str) -> None:
        super().upload_file(local_path, key)
        self._note("upload", key)

    def copy_to(self, key: str, target: Storage, target_key: str) -> None:
        super().copy_to(key, target, target_key)

    def child(self, prefix: str) -> Storage:
        return _TrackingStorage(self.inner.child(prefix), self.world, self.label)

    def at(self, uri: str) -> Storage | None:
        moved = self.inner.at(uri)
        return None if moved is None else _TrackingStorage(moved, self.world, self.label)
