"""Blue's and green's runs in the cutover drive's tests (`services.zero_downtime`, no
Spark), each on its own thread over real records: blue serves the cutover's
``stop_after`` request as the coordinator does; green reports progress, claims the job
(`runtime.cutover.adopt`) and commits N+1 through the real committer."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from typing_extensions import Self

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverProgress, CutoverStore
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.runtime.committer import Committer
from airflow_sparkpoint.runtime.cutover import adopt
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint, transaction_record, write_status

__all__ = ["Blue", "Green", "Polling", "blue_runs", "blue_stopped_after"]


def blue_runs(catalog: Catalog, batch: int, state: str = "running", *,
              heartbeat_at: float | None = None) -> None:
    """Blue's status record, as a run of generation 1 on another host writes it: `state`
    at batch `batch`, its last heartbeat now (at `heartbeat_at` when given)."""
    write_status(catalog, state, generation=1, heartbeat_at=heartbeat_at, last_batch=batch, host="elsewhere",
                 pid=1)


class Blue:
    """Blue's run (generation 1): commits a batch every `pace_s`, heartbeats, and serves
    a stop_after request as the coordinator does: commits through N, checkpoints N,
    completes the request with that checkpoint, and stops. `clock_offset_s`: blue's host
    clock minus the orchestrator's, for the control records it writes; `taken`: the
    requests it took."""

    def __init__(self, catalog: Catalog, sink: FakeSink, *, pace_s: float = 0.05,
                 config: dict[str, Any] | None = None, clock_offset_s: float = 0.0) -> None:
        self.catalog, self.sink, self.pace_s = catalog, sink, pace_s
        self.offset = clock_offset_s
        claimed = catalog.claim_generation({"config": config or {"trigger": "processingTime:1s"}})
        self.generation = claimed.generation
        self.last = 0
        self._commit(0)
        put_checkpoint(catalog, batch_id=0, generation=self.generation)
        self.stopped_at: int | None = None
        self.taken: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _commit(self, batch: int) -> None:
        self.sink.world["committed"][batch] = f"orders-b{batch}-g{self.generation}"
        self.last = batch
        # heartbeats on the orchestrator's clock: the status's skew rules are not tested here
        write_status(self.catalog, "running", generation=self.generation, last_batch=batch, host="elsewhere",
                     pid=1)

    def _run(self) -> None:
        channel = ControlChannel(self.catalog)
        channel.clock = lambda: time.time() + self.offset
        while not self.stop.is_set():
            for request in channel.pending(self.generation):
                n = request.after_batch
                assert request.kind == "stop_after" and n is not None
                channel.acknowledge(request, self.generation)
                self.taken.append(request.id)
                while self.last < n:
                    self._commit(self.last + 1)
                final = put_checkpoint(self.catalog, batch_id=n, generation=self.generation)
                channel.complete(request, generation=self.generation, batch_id=n,
                                 checkpoint=self.catalog.checkpoint_uri(final.id))
                write_status(self.catalog, "stopped", generation=self.generation, last_batch=n,
                             host="elsewhere", pid=1)
                self.stopped_at = n
                return
            self._commit(self.last + 1)
            self.stop.wait(self.pace_s)


class Green:
    """Green's run: follows blue (progress = blue's newest batch, unless not `follows`)
    until N is agreed, waits for blue's stop, then (after `claim_after_s`: its shadow still
    replaying through N) claims the job (`claimed`: its generation) and, if `commits`,
    commits N+1 with the real committer (which records the cutover's `done: committed`).
    Not `claims`: it stops before the claim."""

    def __init__(self, catalog: Catalog, sink: FakeSink, cutover_id: str, *, follows: bool = True,
                 claims: bool = True, commits: bool = True, claim_after_s: float = 0.0) -> None:
        self.catalog, self.sink, self.cid = catalog, sink, cutover_id
        self.follows, self.claims, self.commits, self.claim_after_s = follows, claims, commits, claim_after_s
        self.error: BaseException | None = None
        self.claimed: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            store = CutoverStore(self.catalog)
            while True:
                state = store.read(self.cid)
                if state.done is not None:
                    return
                status = self.catalog.read_status() or {}
                if self.follows:
                    store.progress(CutoverProgress(self.cid, int(status.get("last_batch") or 0), 0.01))
                if state.agreed is not None and \
                        ControlChannel(self.catalog).result(state.agreed.request_id).state == "completed":
                    break
                time.sleep(0.02)
            if not self.claims:
                return
            time.sleep(self.claim_after_s)
            adoption = adopt(self.catalog, self.sink, self.cid, live_dir=None)
            self.claimed = adoption.generation
            if self.commits:
                self._commit_next(adoption.batch_id + 1, adoption.generation)
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc

    def _commit_next(self, batch: int, generation: int) -> None:
        record = transaction_record(self.sink, batch, generation, job="orders", created_at=0.0)
        self.catalog.put_transaction(record)
        committer = Committer(catalog=self.catalog, sink=self.sink, fence=Fence(self.catalog, generation),
                              commit_mode="checkpoint")
        committer.add_pending(record)
        committer.commit_confirmed(put_checkpoint(self.catalog, batch_id=batch, generation=generation,
                                                  pending=[record]))


class Polling:
    """A caught-up green's progress reports only: the record `make()` builds, rewritten
    every `every_s` as green does at each poll of blue (a live green's record changes:
    the orchestrator measures its age by that), until `stop`. A context manager."""

    def __init__(self, catalog: Catalog, make: Any, *, every_s: float = 0.02) -> None:
        self.store, self.make, self.every_s = CutoverStore(catalog), make, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.store.progress(self.make())
            self.stop.wait(self.every_s)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def blue_stopped_after(catalog: Catalog, n: int = 3) -> tuple[FakeSink, str]:
    """Blue (generation 1) stopped after the agreed batch `n` of a new cutover, so green
    may claim: (blue's sink, the cutover's id)."""
    from airflow_sparkpoint.services.cutover import stop_after_batch
    from airflow_sparkpoint.services.zero_downtime import plan_cutover

    sink = FakeSink(f"s-{uuid.uuid4().hex[:8]}")
    blue = Blue(catalog, sink)
    blue.thread.start()
    cid = plan_cutover(catalog, green_root="memory://scratch", requested_by="test").plan.id
    stop = stop_after_batch(catalog, n, timeout_s=20.0, poll_s=0.02, max_heartbeat_age=60.0,
                            requested_by="test", wait=False, generation=1, cutover_id=cid)
    CutoverStore(catalog).agree(cid, n, stop.request_id)
    blue.thread.join(10)
    assert blue.stopped_at == n
    return sink, cid
