"""What ``sparkpoint demo`` shows while it runs: the console (the demo's own lines on the
terminal, everything else in a log file), the progress watcher (which reads the job's
history model) and the verdict. Runs nothing.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_sparkpoint.demo.record import snapshot_key
from airflow_sparkpoint.services.history import (
    current_status,
    liveness,
    read_generation,
    short_name,
    snapshot_records,
)

__all__ = ["PROGRESS_EVERY", "Check", "Console", "Watcher", "gist", "verdict_lines"]

PROGRESS_EVERY = 10.0  # seconds: the longest the console stays silent while waiting


class Console:
    """The demo's own lines go to the terminal; while `quiet` is active everything else
    written to file descriptors 1 and 2 (Airflow's task logs, spark-submit output) goes to
    a log file."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
        self._lock = threading.Lock()
        self.clock = time.monotonic()

    def interrupt_notice(self, message: str) -> None:
        """Write `message` from a signal handler: no lock (the interrupted thread may hold it)."""
        os.write(self._out.fileno(), (message + "\n").encode())

    def close(self) -> None:
        self._out.close()

    def say(self, message: str = "") -> None:
        with self._lock:
            self._out.write(message + "\n")
            self._out.flush()

    def step(self, message: str) -> None:
        self.say(f"\n== {message}")

    def lines(self, lines: Sequence[str]) -> None:
        for line in lines:
            self.say(line)

    def restart_clock(self) -> None:
        self.clock = time.monotonic()

    def progress(self, message: str) -> None:
        self.say(f"   [{time.monotonic() - self.clock:4.0f}s] {message}")

    @contextmanager
    def quiet(self, log: Path) -> Iterator[None]:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(log, "ab") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class Watcher(threading.Thread):
    """Polls the followed job's catalog every second and prints a progress line when its
    state or the running task changed, and at least every PROGRESS_EVERY seconds.
    Remembers every completed checkpoint it saw (retention deletes old ones) and each
    generation's last state, for the record."""

    def __init__(self, console: Console) -> None:
        super().__init__(daemon=True, name="sparkpoint-demo-progress")
        self.console = console
        self.done = threading.Event()
        self.task: tuple[str, float] | None = None  # the DAG's running task and when it started
        # job -> (checkpoint id, generation, batch) -> SnapshotRecord: a retired checkpoint's
        # id can be handed out again (the catalog allocates max(existing) + 1).
        self.seen: dict[str, dict[tuple[int, int, int], Any]] = {}
        self.states: dict[tuple[str, int], str] = {}  # (job, generation) -> last state seen
        self.roles: dict[tuple[str, int], str] = {}
        self._origins: dict[tuple[str, int], str] = {}  # (job, generation) -> what it started from
        self._upcoming: list[str] = []  # roles of the next generations of the followed job
        self._catalog: Any = None
        self._lock = threading.Lock()  # roles and the followed catalog
        self._poll_lock = threading.Lock()  # seen, states, origins: polled by this thread and the demo's

    def follow(self, catalog: Any, upcoming: Sequence[str] = ()) -> None:
        """Report on `catalog` from now on; its new generations take the `upcoming` roles in order."""
        with self._lock:
            self._catalog = catalog
            self._upcoming = list(upcoming)

    def pause(self) -> None:
        """Print nothing until the next `follow` (the demo is printing a report)."""
        with self._lock:
            self._catalog = None

    def set_role(self, job: str, generation: int, role: str) -> None:
        with self._lock:
            self.roles[(job, generation)] = role

    def role(self, job: str, generation: int) -> str:
        with self._lock:
            key = (job, generation)
            if (key not in self.roles and self._upcoming and self._catalog is not None
                    and job == self._catalog.job):
                self.roles[key] = self._upcoming.pop(0)
            return self.roles.get(key, f"generation {generation}")

    def run(self) -> None:
        last: tuple[str, str | None] | None = None
        printed = 0.0
        while not self.done.wait(1.0):
            with self._lock:
                catalog = self._catalog
            if catalog is None:
                continue
            try:
                state, extra = self.poll(catalog)
            except Exception as exc:  # noqa: BLE001 - a racing retention delete, a half-written file
                state, extra = f"(could not read the catalog: {exc})", ""
            task = self.task
            key = (state, task[0] if task else None)
            if key != last or time.monotonic() - printed >= PROGRESS_EVERY:
                prefix = f"{task[0]} for {time.monotonic() - task[1]:.0f}s | " if task else ""
                self.console.progress(prefix + state + extra)
                last, printed = key, time.monotonic()

    def checkpoints_of(self, job: str) -> list[Any]:
        """Every checkpoint of `job` seen so far, oldest first."""
        with self._poll_lock:
            return sorted(self.seen.get(job, {}).values(), key=lambda m: (m.created_at, m.id))

    def poll(self, catalog: Any) -> tuple[str, str]:
        """Record what the catalog shows now; return the progress line: what changes
        only with the job's progress, and what changes with the clock."""
        with self._poll_lock:
            return self._poll(catalog)

    def _poll(self, catalog: Any) -> tuple[str, str]:
        status, _current = current_status(catalog)  # a zombie's late heartbeat does not hide the live run
        seen = self.seen.setdefault(catalog.job, {})
        for record in snapshot_records(catalog, "checkpoint", drills=False):
            if record.valid:
                seen.setdefault(snapshot_key(record), record)
        if status is None:
            return f"job {catalog.job}: no driver has started yet", ""
        generation, state = status.generation, status.state
        self.states[(catalog.job, generation)] = state
        key = (catalog.job, generation)
        if key not in self._origins:
            self._origins[key] = read_generation(catalog, generation, status=status).origin
        line = f"{self.role(*key)} (generation {generation}, from {self._origins[key]}): {state}"
        if status.last_batch is not None:
            line += f", confirmed batch {status.last_batch}"
        mine = sorted({r.id for r in seen.values() if r.generation == generation})
        if mine:
            line += ", checkpoints " + " ".join(f"chk-{i}" for i in mine[-4:])
        if status.savepoint_uri:
            line += f", {short_name(status.savepoint_uri)}"
        if state == "failed" and status.error:
            line += f": {gist(str(status.error), 80)}"
        _alive, age = liveness(status, generation, float("inf"))
        extra = (f" (no heartbeat for {age:.0f}s)" if state in ("starting", "running") and (age or 0) > 5
                 else "")
        return line, extra


@dataclass
class Check:
    """One line of the verdict."""

    what: str
    ok: bool
    detail: str = ""


def verdict_lines(checks: Sequence[Check]) -> tuple[bool, list[str]]:
    """The verdict block: one line per check, then the overall YES/NO line."""
    lines = [f"   [{'ok' if c.ok else 'FAILED'}] {c.what}" + (f": {c.detail}" if c.detail else "")
             for c in checks]
    ok = bool(checks) and all(c.ok for c in checks)
    lines.append(f"   exactly-once over the whole demo: {'YES' if ok else 'NO'}")
    return ok, lines


_ERROR = re.compile(r"\b(\w*(?:Error|Exception)): (.+)")


def gist(text: str, limit: int = 120) -> str:
    """One line of an error: a failed spark-submit's exit code and the last Python error
    in its output (the driver's traceback), else the first line."""
    parts = []
    code = re.search(r"Cannot execute: spark-submit.*?Error code is: (-?\d+)", text, re.DOTALL)
    if code:
        parts.append(f"spark-submit exited with {code.group(1)}"
                     + (" (SIGKILL)" if code.group(1) == "-9" else ""))
    errors = [m for m in _ERROR.finditer(text) if m.group(1) != "AirflowException"]
    if errors:
        parts.append(f"{errors[-1].group(1)}: {errors[-1].group(2).strip()}")
    line = ": ".join(parts) or (text.strip().splitlines() or [""])[0]
    line = re.sub(r"file://\S*/([^/\s]+)", r"\1", line)  # a snapshot's name says enough
    return line if len(line) <= limit else line[: limit - 1] + "…"


