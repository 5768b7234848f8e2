"""A driver detached from the Airflow task that started it: start it in a session of its
own (`launch`), record where it runs (`DriverProcess`), and end it later from another
process (`stop_group`) only when that record still names it.

The record is what a kill needs to be safe: the host and its boot id (a pid means
nothing on another machine or after a reboot), the process group (the launcher leads it:
``killpg`` reaches the launcher, spark-submit's JVM and the Python driver) and the
leader's start time in clock ticks (a reused pid has another). No Airflow, no Spark.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.launcher import boot_id, host_name
from airflow_sparkpoint.runtime.livedir import proc_stat, process_start

__all__ = ["KILL_GRACE_S", "DriverProcess", "group_exists", "launch", "stop_group"]

log = logging.getLogger(__name__)

#: SIGTERM, then SIGKILL this many seconds later (what Airflow's task supervisor does)
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class DriverProcess:
    """Where a detached driver runs: `host` and its `boot_id`, the process group `pgid`
    its launcher leads (pid == pgid), the leader's start time `leader_start` (clock ticks
    since boot, "" when unknown) and the `log` file its output goes to."""

    host: str
    boot_id: str
    pgid: int
    leader_start: str
    log: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> DriverProcess:
        """Parse a record read from a shared place (the task state store, trigger kwargs).

        :raises ConfigError: not a mapping, or a field missing or of the wrong type.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"detached driver record {data!r} is invalid; expected a mapping")
        pgid = data.get("pgid")
        if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid <= 1:
            raise ConfigError(f"detached driver record pgid={pgid!r} is invalid; expected an integer > 1")
        fields = {}
        for name in ("host", "boot_id", "leader_start", "log"):
            value = data.get(name, "")
            if not isinstance(value, str):
                raise ConfigError(f"detached driver record {name}={value!r} is invalid; expected a string")
            fields[name] = value
        return cls(pgid=pgid, **fields)

    #: the submit's deploy mode, as the catalog's launch record names it
    deploy_mode: ClassVar[str] = "client"

    def launch_json(self) -> dict[str, Any]:
        """The driver as the catalog's launch record names it (`checkpoints.launches`,
        ``kind`` ``process``: what `sparkpoint status` shows)."""
        return {"kind": "process", "host": self.host, "pgid": self.pgid, "log": self.log}

    def describe(self) -> str:
        return f"process group {self.pgid} on host {self.host or '?'} (log {self.log or '?'})"

    def here(self) -> bool:
        """Whether it runs on this machine since its boot (so its pids mean something here)."""
        return (bool(self.host) and self.host == host_name()
                and bool(self.boot_id) and self.boot_id == boot_id())

    def running(self) -> bool:
        """Whether its process group still has a member (only meaningful when `here`):
        its leader with the recorded start time, or, once the leader is gone, any process
        of group `pgid` (a group id is never reused while a member lives, so a live
        group without a leader is still this one)."""
        start = process_start(self.pgid)
        if start is not None and self.leader_start and start != self.leader_start:
            return False  # the pid is another process's now: the group ended long ago
        return group_exists(self.pgid)

    # the driver handle `services.follow` watches and stops (`follow.DriverHandle`)

    def active(self) -> bool:
        """Whether it is known to still run (here, and its group has a member)."""
        return self.here() and self.running()

    def gone(self) -> bool:
        """Whether it is known to have ended (here, and its group is empty)."""
        return self.here() and not self.running()

    def kill(self) -> str:
        return stop_group(self)

    def where(self) -> dict[str, Any]:
        return {"host": self.host, "log": self.log}


def group_exists(pgid: int) -> bool:
    """Whether process group `pgid` has a member that runs (a zombie, killed but not yet
    reaped by its parent, runs nothing and does not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for pid in psutil.pids():
        fields = proc_stat(pid)  # state, ppid, pgrp, ...
        if fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def launch(command: Sequence[str], env: Mapping[str, str], *, log_path: str,
           keep_fd: int | None) -> DriverProcess:
    """Start `command` through the detached launcher (`runtime.launcher`) in a new session:
    standard input from /dev/null, output and errors appended to `log_path`, every other
    descriptor closed but `keep_fd` (the submission directory's lock, kept open by the
    launcher and spark-submit). Return where it runs.

    :raises OSError: the log file cannot be opened or the launcher cannot start.
    """
    keep = () if keep_fd is None else (keep_fd,)
    launcher = [sys.executable, "-m", "airflow_sparkpoint.runtime.launcher",
                *(f"--keep-fd={fd}" for fd in keep), "--", *command]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        process = subprocess.Popen(launcher, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                   close_fds=True, pass_fds=keep, start_new_session=True, env=dict(env))
    finally:
        os.close(fd)
    # Nothing waits for it: the task process exits after deferring and init reaps it.
    process.returncode = 0  # keep Popen.__del__ from warning about a child it will not wait for
    return DriverProcess(host=host_name(), boot_id=boot_id(), pgid=process.pid,
                         leader_start=process_start(process.pid) or "", log=log_path)


def stop_group(process: DriverProcess, *, grace_s: float = KILL_GRACE_S, poll_s: float = 0.2) -> str:
    """SIGTERM the detached driver's process group, SIGKILL it after `grace_s` seconds if a
    member is left; only when `process` runs here and still is the recorded one. Returns
    what was done (for the log). Never raises."""
    if not process.here():
        return f"not stopped by signal: {process.describe()} is not on this machine (boot)"
    if not process.running():
        return f"{process.describe()} had already ended"
    try:
        os.killpg(process.pgid, signal.SIGTERM)
    except OSError as exc:
        return f"SIGTERM to {process.describe()} failed: {exc}"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_exists(process.pgid):
            return f"{process.describe()} ended after SIGTERM"
        time.sleep(poll_s)
    try:
        os.killpg(process.pgid, signal.SIGKILL)
    except OSError as exc:
        return f"SIGKILL to {process.describe()} failed: {exc}"
    return f"{process.describe()} killed (SIGKILL {grace_s:.0f} s after SIGTERM)"
