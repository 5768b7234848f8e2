"""Giving the driver's free heap memory back to the system, for jobs that run for weeks.

glibc's malloc keeps the memory a process freed, to reuse it; with many threads (each
gets an arena) and allocations of every size (S3 responses, Delta commits, Spark's
Python side) what it keeps grows slowly with the job's age: about 10 MB in 40 minutes
for the soak's driver while its objects, Python's allocator and malloc's memory in use
stayed flat, and all of it came back with one ``malloc_trim`` (docs/BENCHMARKS.md, "What
the driver's memory is made of"). The coordinator calls `trim` once an hour.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

__all__ = ["TRIM_EVERY_S", "trim"]

log = logging.getLogger(__name__)

#: seconds between two trims of a running job
TRIM_EVERY_S = 3600.0

_UNLOADED: Any = object()
_malloc_trim: Any = _UNLOADED


def _trim_function() -> Any:
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS, Windows)."""
    global _malloc_trim
    if _malloc_trim is _UNLOADED:
        _malloc_trim = None
        try:  # the C library the process already has loaded: no search, no child process
            function = getattr(ctypes.CDLL(None), "malloc_trim", None)
            if function is not None:
                function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
                _malloc_trim = function
        except Exception as exc:  # noqa: BLE001 - housekeeping: `trim` never raises
            log.debug("no malloc_trim: %s", exc)
    return _malloc_trim


def trim() -> bool:
    """Return the free memory malloc holds to the system (``malloc_trim(0)``); True if
    it ran, False where the C library has no such call. Never raises: housekeeping."""
    function = _trim_function()
    if function is None:
        return False
    try:
        function(0)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.debug("malloc_trim failed: %s", exc)
        return False
    return True
