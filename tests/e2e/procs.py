"""Processes seen through /proc: who runs, who is whose child, who carries a marker in
its environment. The fault tests use these to prove a kill landed (the pids are gone)
and that nothing outlives a task (no driver left running)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    cmdline: str
    start_ticks: int  # start time in clock ticks after boot: tells a reused pid apart

    def alive(self) -> bool:
        """Still the same process (same start time), not a zombie."""
        current = read(self.pid)
        return current is not None and current.start_ticks == self.start_ticks


def read(pid: int) -> Proc | None:
    """The process `pid`, or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ..." - comm may contain spaces and parentheses.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), cmdline=cmdline,
                start_ticks=int(fields[19]))


def all_procs() -> list[Proc]:
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            proc = read(int(entry))
            if proc is not None:
                procs.append(proc)
    return procs


def environ_has(pid: int, key: str, value: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{key}={value}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


def matching(*needles: str, env: tuple[str, str] | None = None) -> list[Proc]:
    """Live processes whose command line contains every needle (and, if given, whose
    environment has ``env`` = (key, value))."""
    found = []
    for proc in all_procs():
        if proc.pid == os.getpid() or not all(n in proc.cmdline for n in needles):
            continue
        if env is not None and not environ_has(proc.pid, *env):
            continue
        found.append(proc)
    return found


def descendants(pid: int) -> list[Proc]:
    procs = all_procs()
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def kill(procs: Iterable[Proc], sig: int = signal.SIGKILL) -> list[Proc]:
    """Signal every still-live process of `procs`; returns those signalled."""
    hit = []
    for proc in procs:
        if proc.alive():
            try:
                os.kill(proc.pid, sig)
                hit.append(proc)
            except ProcessLookupError:
                pass
    return hit


def kill_marked(key: str, value: str, sig: int = signal.SIGKILL) -> list[Proc]:
    """Signal every process whose environment has ``key=value`` (not this one)."""
    marked = [p for p in all_procs() if p.pid != os.getpid() and environ_has(p.pid, key, value)]
    return kill(marked, sig)


def wait_gone(procs: Iterable[Proc], timeout: float = 60) -> list[Proc]:
    """Wait until none of `procs` is alive; returns those still alive at the timeout."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if p.alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def driver_processes(job: str, token: str | None = None) -> list[Proc]:
    """The processes of the live client-mode drivers of Sparkpoint job `job`: the
    ``spark-submit`` JVM (its command line names ``spark.sparkpoint.job=<job>``) and its
    descendants (the Python driver, Python workers)."""
    env = ("SPARKPOINT_E2E_STACK", token) if token else None
    jvms = [p
            for p in matching("org.apache.spark.deploy.SparkSubmit", f"spark.sparkpoint.job={job}", env=env)]
    found = {p.pid: p for p in jvms}
    for jvm in jvms:
        for child in descendants(jvm.pid):
            found[child.pid] = child
    return sorted(found.values(), key=lambda p: p.pid)
