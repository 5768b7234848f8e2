"""Blue's run in the cutover drive's tests (`services.zero_downtime`, no Spark): the
generation that serves the cutover's ``stop_after`` request as the coordinator does."""

from __future__ import annotations

import threading
import time
from typing import Any

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.status import JobStatus
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint

__all__ = ["Blue"]


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
        self.generation = catalog.claim_generation({"config": config or {"trigger": "processingTime:1s"}}).generation
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
        now = time.time()  # heartbeats on the orchestrator's clock: the status's skew rules are not tested here
        self.catalog.write_status(JobStatus("orders", self.generation, "running", now - 5, now, last_batch=batch,
                                            host="elsewhere", pid=1).to_json())

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
                now = time.time()
                self.catalog.write_status(JobStatus("orders", self.generation, "stopped", now - 5, now,
                                                    last_batch=n, host="elsewhere", pid=1).to_json())
                self.stopped_at = n
                return
            self._commit(self.last + 1)
            self.stop.wait(self.pace_s)
