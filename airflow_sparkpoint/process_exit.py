"""Ending a process Sparkpoint owns once its work is done, without native teardown.

Why: a pyarrow dataset read through a filesystem implemented in Python (deltalake's
``to_pyarrow_table()`` wraps delta-rs' object store in ``pyarrow.fs.PyFileSystem``, with
``pre_buffer=True``) leaves read-ahead work on Arrow's I/O threads that still holds
Python-owned buffers (``arrow::py::PyBuffer``) after the read returned. When such a
thread drops the last reference while the interpreter finalizes, ``~PyBuffer`` asks for
the GIL; CPython up to 3.13 ends a thread that does so after finalization began with
``pthread_exit``, whose forced unwind through that ``noexcept`` destructor calls
``std::terminate``: "terminate called without an active exception", exit 134 (SIGABRT),
after the output was written and committed. Seen with deltalake 1.6 and pyarrow 26 on
Python 3.11; ``DeltaTable.version()`` alone never does it (no Arrow I/O threads).

Sparkpoint's own reads avoid that path (`sinks.delta_rows.read_table`); the
processes it owns end through `exit_process`, so no library they loaded can turn a
finished command into a failed one at exit: the ``sparkpoint`` command, and the job
scripts under ``dags/jobs`` once their run returned (a job script's exit is its
author's; a failed run raises before it and exits through the usual path)::

    if __name__ == "__main__":
        main()
        exit_process(0)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_process"]


def exit_process(code: int) -> NoReturn:
    """Flush logging, stdout and stderr, then end the process with `code` at once:
    no atexit hooks, no interpreter finalization, no native static destructors.

    Only where the caller owns the process's exit, after everything it had to do is
    done and durable: atexit hooks of other libraries do not run.
    """
    try:
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or replaced by None
                pass
        os._exit(code)
