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
``committed``  sink commit of N done; its record not yet cleaned up
``savepoint``  a savepoint is half copied
=============  ============================================================

The driver dies with SIGKILL — no cleanup, no ``finally`` — like a lost machine. Under
``spark-submit`` the JVM parent is killed too so nothing of the driver survives.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

POINTS = ("stage", "record", "confirmed", "copy", "metadata", "checkpointed", "committed", "savepoint")
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
