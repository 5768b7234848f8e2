"""What ``sparkpoint demo`` shows while it runs and after it: the console (the demo's
own lines on the terminal, everything else in a log file), the progress watcher, the
record tables (generation switches, checkpoint history, savepoints, Delta table history)
and the verdict. Reads catalogs and tables; runs nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        # job -> (checkpoint id, generation, batch) -> SnapshotMetadata: a retired checkpoint's
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
            if key not in self.roles and self._upcoming and self._catalog is not None and job == self._catalog.job:
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
        status = catalog.read_status()
        seen = self.seen.setdefault(catalog.job, {})
        for meta in catalog.checkpoints():
            seen.setdefault(snapshot_key(meta), meta)
        if not status:
            return f"job {catalog.job}: no driver has started yet", ""
        generation, state = int(status["generation"]), str(status["state"])
        self.states[(catalog.job, generation)] = state
        key = (catalog.job, generation)
        if key not in self._origins:
            details = generation_record(catalog, generation).get("details", {})
            self._origins[key] = origin(details.get("plan"))
        line = f"{self.role(*key)} (generation {generation}, from {self._origins[key]}): {state}"
        if status.get("last_batch") is not None:
            line += f", confirmed batch {status['last_batch']}"
        mine = sorted({m.id for m in seen.values() if m.generation == generation})
        if mine:
            line += ", checkpoints " + " ".join(f"chk-{i}" for i in mine[-4:])
        if status.get("savepoint_uri"):
            line += f", {short_name(status['savepoint_uri'])}"
        if state == "failed" and status.get("error"):
            line += f": {gist(str(status['error']), 80)}"
        age = time.time() - float(status.get("heartbeat_at") or time.time())
        extra = f" (no heartbeat for {age:.0f}s)" if state in ("starting", "running") and age > 5 else ""
        return line, extra


@dataclass
class Check:
    """One line of the verdict."""

    what: str
    ok: bool
    detail: str = ""


def verdict_lines(checks: Sequence[Check]) -> tuple[bool, list[str]]:
    """The verdict block: one line per check, then the overall YES/NO line."""
    lines = [f"   [{'ok' if c.ok else 'FAILED'}] {c.what}" + (f": {c.detail}" if c.detail else "") for c in checks]
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
        parts.append(f"spark-submit exited with {code.group(1)}" + (" (SIGKILL)" if code.group(1) == "-9" else ""))
    errors = [m for m in _ERROR.finditer(text) if m.group(1) != "AirflowException"]
    if errors:
        parts.append(f"{errors[-1].group(1)}: {errors[-1].group(2).strip()}")
    line = ": ".join(parts) or (text.strip().splitlines() or [""])[0]
    line = re.sub(r"file://\S*/([^/\s]+)", r"\1", line)  # a snapshot's name says enough
    return line if len(line) <= limit else line[: limit - 1] + "…"


def short_name(uri: str | None) -> str:
    """The last path component of a snapshot URI (``chk-3``, ``savepoint-2-x1y2``)."""
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "empty state"


def origin(plan: str | None) -> str:
    """What a generation started from, short: ``empty state``, ``chk-4``, ``savepoint-1-x1y2``."""
    if not plan:
        return "-"
    match = re.search(r"file://[^\s)]+", plan)
    return short_name(match.group(0)) if match else plan.split(" (")[0]


def generation_record(catalog: Any, generation: int) -> dict[str, Any]:
    """The record a generation's driver wrote when it claimed it (``{}`` if unreadable)."""
    from airflow_sparkpoint.checkpoints import layout

    try:
        return dict(json.loads(catalog.store.get(layout.generation_key(generation))))
    except Exception:  # noqa: BLE001 - shown as unknown
        return {}


def run_result(catalog: Any, generation: int) -> dict[str, Any]:
    """A generation's run result (``{}``: it was killed or failed, or still runs)."""
    from airflow_sparkpoint.checkpoints.status import result_key

    try:
        return dict(json.loads(catalog.store.get(result_key(generation))))
    except Exception:  # noqa: BLE001 - a killed or failed run leaves no result
        return {}




def human_bytes(size: float) -> str:
    """``512 B``, ``1.4 KiB``, ``3.0 MiB`` ..."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "   ") -> list[str]:
    """Lines of a plain-text table: numbers right-aligned, everything else left-aligned,
    ``None`` shown as ``-``; a dashed rule under the header.

    :raises ValueError: a row has a different number of cells than `headers`.
    """
    cells: list[list[str]] = []
    numeric = [True] * len(headers)
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"table row {list(row)!r} has {len(row)} cells; expected {len(headers)} ({headers})")
        cells.append(["-" if v is None else str(v) for v in row])
        for i, value in enumerate(row):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                numeric[i] = False
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(list(headers)), line(["-" * w for w in widths]), *(line(r) for r in cells)]


# ---------------------------------------------------------------------------- the record


def generation_table(catalog: Any, role: Callable[[int], str], last_states: Mapping[tuple[str, int], str],
                     t0: float) -> list[str]:
    """Every generation of the job: its role, when it started (seconds after `t0`), what it
    restored and how it ended (its run result, else the last state the watcher saw)."""
    rows = []
    for generation in range(1, catalog.current_generation() + 1):
        record = generation_record(catalog, generation)
        result = run_result(catalog, generation)
        if result:
            outcome = f"{result['status']}, batches {result['first_batch']}..{result['last_batch']}"
            if result.get("committed_batches"):
                outcome += f", committed {result['committed_batches']}"
            restored = short_name(result.get("restored_from"))
        else:  # a generation that failed, or died (SIGKILL) with its status still "running"
            state = last_states.get((catalog.job, generation))
            outcome = ("failed" if state == "failed" else f"died while {state}" if state else "died") + \
                ", no run result"
            restored = origin(record.get("details", {}).get("plan"))
        started = record.get("started_at")
        rows.append((generation, role(generation), f"+{started - t0:.0f}s" if started else None, restored, outcome))
    return format_table(["gen", "role", "started", "restored from", "outcome"], rows)


def snapshot_key(meta: Any) -> tuple[int, int, int]:
    """What identifies a checkpoint over a job's history: (id, generation, batch)."""
    return (meta.id, meta.generation, meta.batch_id)


def checkpoint_table(observed: Iterable[Any], retained: Iterable[Any], role: Callable[[int], str]) -> list[str]:
    """Checkpoints (`SnapshotMetadata`), oldest first: batch, generation, duration, bytes
    copied (incremental) and total, and whether retention still keeps them (`retained`:
    the catalog's current checkpoints)."""
    keep = {snapshot_key(m) for m in retained}
    rows = [(m.id, m.batch_id, m.generation, role(m.generation), m.stats.duration_ms,
             human_bytes(m.stats.bytes_copied), human_bytes(m.stats.bytes_total), m.stats.file_count,
             "retained" if snapshot_key(m) in keep else "retired")
            for m in sorted(observed, key=lambda m: (m.created_at, m.id))]
    return format_table(["chk", "batch", "gen", "role", "ms", "copied", "total", "files", "now"], rows)


def savepoint_table(catalog: Any, role: Callable[[int], str], t0: float) -> list[str]:
    """The job's valid savepoints, oldest first."""
    rows = [(short_name(e.uri), e.metadata.batch_id, e.metadata.generation, role(e.metadata.generation),
             f"+{e.metadata.created_at - t0:.0f}s", human_bytes(e.metadata.total_bytes), len(e.metadata.files))
            for e in reversed(catalog.list_savepoints()) if e.metadata is not None]
    return format_table(["savepoint", "batch", "gen", "role", "taken", "size", "files"], rows)


def delta_history_table(history: Iterable[Mapping[str, Any]], role: Callable[[int], str]) -> list[str]:
    """`demo_support.delta_history` entries: version, operation and Sparkpoint's commit info."""
    rows = [(e["version"], e["operation"], e["job"], e["batch"], e["generation"],
             None if e["generation"] is None else role(e["generation"]))
            for e in history]
    return format_table(["version", "operation", "sparkpoint.job", "batch", "generation", "role"], rows)
