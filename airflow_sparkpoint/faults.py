"""Test-only fault injection: SIGKILL the driver at a chosen point of the lifecycle.

**For tests only.** Armed by the environment of the driver process::

    SPARKPOINT_TEST_FAULT=<point>:<batch>      e.g. "confirmed:2"
    SPARKPOINT_TEST_FAULT_ONCE=/path/marker    optional: fire only if the marker does not
                                               exist yet, and create it when firing (so an
                                               Airflow retry of the same task runs clean)

Points, in lifecycle order for batch N:

=============  ============================================================
``stage``      the sink staged batch N; its pre-commit record is not written
``record``     the record is written; Spark has not written ``commits/N``
``confirmed``  Spark confirmed N (``commits/N``); no checkpoint covers it yet
``copy``       half of the new files of the checkpoint of N are uploaded
``metadata``   all files uploaded; ``_metadata`` not written
``checkpointed`` checkpoint of N complete; sink commit not done
``promoting``  the sink commit of N is half done (half the files promoted or
               uploads completed; Delta: the log entry is written, the
               commit call has not returned) — in the job, or in the
               external commit step (``sparkpoint commit``)
``committed``  sink commit of N done; its record not yet cleaned up
``savepoint``  a savepoint (of confirmed batch N) is half copied
``stopped``    stop-with-savepoint: the savepoint of N is complete and
               reported; the run has not ended yet
=============  ============================================================

The driver dies with SIGKILL — no cleanup, no ``finally`` — like a lost machine. Under
``spark-submit`` the JVM parent is killed too so nothing of the driver survives.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

POINTS = ("stage", "record", "confirmed", "copy", "metadata", "checkpointed", "promoting", "committed", "savepoint",
          "stopped")
ENV = "SPARKPOINT_TEST_FAULT"
ENV_ONCE = "SPARKPOINT_TEST_FAULT_ONCE"


def _armed() -> tuple[str, int] | None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    point, _, batch = spec.partition(":")
    if point not in POINTS or not batch.strip().lstrip("-").isdigit():
        raise ValueError(f"{ENV}={spec!r} is invalid; expected <point>:<batch> with point in {', '.join(POINTS)}")
    return point, int(batch)


def armed(point: str) -> bool:
    """Whether a fault is armed at `point` (for any batch)."""
    spec = _armed()
    return spec is not None and spec[0] == point


def maybe_kill(point: str, batch_id: int) -> None:
    """SIGKILL this driver if the armed fault matches `point` and `batch_id`."""
    armed = _armed()
    if armed is None or armed != (point, batch_id):
        return
    marker = os.environ.get(ENV_ONCE, "").strip()
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{point}:{batch_id}\n".encode())
        os.fsync(fd)
        os.close(fd)
    # Printed before dying so a test log shows where the driver went down.
    print(f"SPARKPOINT_TEST_FAULT: killing driver at {point}:{batch_id}", flush=True)
    kill_driver()


def maybe_kill_halfway(point: str, batch_id: int, done: int, total: int) -> None:
    """`maybe_kill` once half of `total` steps are `done` (the first step when total is 1)."""
    if done == max(1, total // 2):
        maybe_kill(point, batch_id)


def map_in_halves(pool: Executor, fn: Callable[[T], R], items: Sequence[T], point: str, batch_id: int) -> list[R]:
    """``list(pool.map(fn, items))``; when `point` is armed, the second half starts only
    after `maybe_kill` at the halfway mark (so a kill leaves exactly half done)."""
    if not armed(point) or len(items) < 2:
        results = list(pool.map(fn, items))
        maybe_kill(point, batch_id)
        return results
    half = len(items) // 2
    results = list(pool.map(fn, items[:half]))
    maybe_kill(point, batch_id)
    return results + list(pool.map(fn, items[half:]))


def kill_driver() -> None:
    """SIGKILL the JVM parent (when it is spark-submit's) and then this process."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        cmdline = b""
    if b"org.apache.spark.deploy.SparkSubmit" in cmdline:
        os.kill(parent, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
