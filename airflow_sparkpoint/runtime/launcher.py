"""The detached launcher: the process a deferrable submit starts in a session of its own,
which runs ``spark-submit`` and outlives the Airflow task that started it.

``python -m airflow_sparkpoint.runtime.launcher --keep-fd N -- spark-submit ...``

The task starts it with ``start_new_session=True`` (`services.detached.launch`): it leads
a new session and process group, so the task supervisor's ``killpg`` of the task's
group never reaches it, and when the task process exits it is re-parented to init. Its
standard output and error are a log file, never the task's pipes (the supervisor reads
those to their end). File descriptor `N` is the submission directory's lock
(`services.submit_dir`): the launcher and spark-submit's JVM keep it open, so a later
submission's sweep cannot delete the directory of a running driver; when both have
ended the lock drops and the next sweep removes the directory.

A SIGTERM sent to the launcher alone is passed on to spark-submit (a ``killpg`` of the
group reaches both); the launcher waits for spark-submit and exits with its code.
No Airflow, no Spark: standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = ["BOOT_ID_PATH", "boot_id", "host_name", "main"]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This machine's boot id (changes at every boot: a pid recorded before it means
    nothing after), or "" where the kernel does not tell."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def host_name() -> str:
    """The host name a detached driver's record names (the one `JobStatus.host` uses)."""
    return socket.gethostname()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command after ``--`` keeping descriptor ``--keep-fd`` open in it; return its
    exit code (128 + signal when a signal ended it)."""
    parser = argparse.ArgumentParser(prog="airflow_sparkpoint.runtime.launcher")
    parser.add_argument("--keep-fd", type=int, action="append", default=[],
                        help="a descriptor spark-submit inherits (the submission directory's lock)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = [c for c in args.command]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no command after --")
    keep = tuple(fd for fd in args.keep_fd if fd >= 0)
    for fd in keep:
        os.set_inheritable(fd, True)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the session has no terminal; never die of one
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=keep)

    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
