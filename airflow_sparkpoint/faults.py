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
``stop_after`` the run took a ``stop_after`` request for batch N (acknowledged,
               in force); nothing past N staged
``stopped_after`` the run stopped after batch N: its final checkpoint of N is
               complete and N is committed; the request is not completed yet
``cutover_claimed`` green (`runtime.cutover.adopt`) claimed blue's generation + 1
               at the agreed batch N; nothing re-read, no origin yet
``cutover_warmup`` green's shadow replayed blue's batch N (Spark committed it in
               the shadow's live location); its progress not reported, its
               checkpoint of N maybe not complete (`runtime.follow`)
``cutover_agreement`` the agreement of a cutover at batch N: blue's ``stop_after``
               request is filed, the ``agreed`` record is not written
               (`checkpoints.cutover.CutoverStore.agree`, in the orchestrator)
``cutover_ready`` green's shadow is at the agreed batch N and blue completed its
               stop there; green has not claimed blue's generation + 1
``cutover_first_commit`` green's first batch N (the agreed batch + 1) is committed
               into blue's sink; its record not cleaned up, the cutover's end
               not written
``recovery``   restore-time recovery (recoverAndCommit / recoverAndAbort) has
               settled half of the recorded transactions; N is the batch of
               the last one settled (double faults: a kill during recovery)
``rewind``     ``restore.sinkAhead=rewind`` rewound a sink to batch N; the
               run has not completed a checkpoint since
``abort``      half of the transactions being aborted (a stop, a rollback
               ``abort_generation``, the commit step) are aborted; N is the
               last one's batch
``retention``  retention deleted half of the checkpoints it is removing;
               N is the batch of the checkpoint that triggered it
``rescale``    ``restore.statePartitions``: Spark's repartitioner has written
               the offset log entry of its synthetic batch N+1 in the private
               live copy and is rewriting the state (N: the restored batch)
=============  ============================================================

Pause points (deterministic race tests with two real drivers)::

    SPARKPOINT_TEST_PAUSE=<point>[:<batch>][,<point>[:<batch>]...]
    SPARKPOINT_TEST_PAUSE_DIR=/path/dir

When the driver reaches an armed pause point it creates ``<dir>/<point>.reached``
(holding the pid, batch and generation) and blocks until ``<dir>/<point>.release``
exists, then goes on. The Spark conf keys ``spark.sparkpoint.test.pauseAt`` and
``spark.sparkpoint.test.pauseDir`` set the same two variables for the driver process.
A test proves its race happened by waiting for the ``.reached`` file.

Pause points of the runtime (batch N as noted; details include the generation):

==================  ============================================================
``after_plan``      the read-only pre-check is done (N: the planned restart
                    batch, None for empty state); the generation is not claimed
``recovery``        restore-time recovery is about to settle transactions (N:
                    the restart batch)
``after_rewind``    ``restore.sinkAhead=rewind`` rewound the sink to N; no
                    checkpoint since
``before_live``     claimed, recovered and the sink's position checked (N: the
                    restart batch); the live location is not filled yet
``stage``           ``foreachBatch`` of batch N, before the sink stages it
``recorded``        the pre-commit record of batch N is written; Spark has not
                    written ``commits/N`` (a stop taken here aborts batch N)
``after_metadata``  checkpoint of N is complete; retention and the sink commit
                    of N are not done
``retention_delete`` the retention pass after the checkpoint of N has checked the
                    generation and is about to delete checkpoints (held, it is
                    the stale deleter of a zombie)
``replay``          the self-healing fallback is about to write batch N's recorded
                    offsets and re-run it (`runtime.replay`); claimed and recovered
==================  ============================================================

Pause points of the sinks (batch N of the transaction at hand; details carry ``txn``):

==================  ============================================================
``staged``          the sink staged batch N (end of ``stage``); nothing recorded yet
``before_claim``    the commit of N passed the runtime's checks; nothing decided,
                    claimed or visible yet (Delta: before its decision and log entry)
``claimed``         the transaction decided to promote and holds N's claim; no file
                    visible yet (Delta: decided, before its log entry; also where a
                    Delta abort that found the decision is about to commit it)
``landed``          Delta: N's log entry is written; a merge's staged files are not
                    removed yet
``promoting``       half the files of N are visible (file sinks)
``promoted``        every file of N is visible; the claim is not marked done yet
==================  ============================================================

The driver dies with SIGKILL — no cleanup, no ``finally`` — like a lost machine. Under
``spark-submit`` the JVM parent is killed too so nothing of the driver survives.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

__all__ = ["ENV", "ENV_ONCE", "PAUSE_DIR_ENV", "PAUSE_ENV", "PAUSE_TIMEOUT_S", "POINTS", "armed",
           "kill_driver", "map_in_halves", "maybe_kill", "maybe_kill_halfway", "pause"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

POINTS = ("stage", "record", "confirmed", "copy", "metadata", "checkpointed", "promoting", "committed",
          "savepoint", "stopped", "recovery", "rewind", "abort", "retention", "rescale", "stop_after",
          "stopped_after", "cutover_claimed", "cutover_warmup", "cutover_agreement", "cutover_ready",
          "cutover_first_commit")
ENV = "SPARKPOINT_TEST_FAULT"
ENV_ONCE = "SPARKPOINT_TEST_FAULT_ONCE"
PAUSE_ENV = "SPARKPOINT_TEST_PAUSE"
PAUSE_DIR_ENV = "SPARKPOINT_TEST_PAUSE_DIR"
#: how long a paused driver waits for its release before going on anyway (a test that
#: forgot to release must not hang CI forever)
PAUSE_TIMEOUT_S = float(os.environ.get("SPARKPOINT_TEST_PAUSE_TIMEOUT", "600"))


def _armed() -> tuple[str, int] | None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    point, _, batch = spec.partition(":")
    if point not in POINTS or not batch.strip().lstrip("-").isdigit():
        raise ValueError(f"{ENV}={spec!r} is invalid; expected <point>:<batch> with "
                         f"point in {', '.join(POINTS)}")
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
    # Announced before dying so a test log shows where the driver went down (and a test
    # can prove its fault fired).
    _announce(f"SPARKPOINT_TEST_FAULT: killing driver at {point}:{batch_id}")
    kill_driver()


def maybe_kill_halfway(point: str, batch_id: int, done: int, total: int) -> None:
    """`maybe_kill` once half of `total` steps are `done` (the first step when total is 1)."""
    if done == max(1, total // 2):
        maybe_kill(point, batch_id)


def map_in_halves(pool: Executor, fn: Callable[[T], R], items: Sequence[T], point: str,
                  batch_id: int) -> list[R]:
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


def _pauses() -> dict[str, int | None]:
    spec = os.environ.get(PAUSE_ENV, "").strip()
    armed: dict[str, int | None] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, batch = item.partition(":")
        if not point or (batch.strip() and not batch.strip().lstrip("-").isdigit()):
            raise ValueError(f"{PAUSE_ENV}={spec!r} is invalid; expected <point>[:<batch>][,...]")
        armed[point] = int(batch) if batch.strip() else None
    return armed


def pause(point: str, batch_id: int | None = None, **details: object) -> bool:
    """Block at pause point `point` until the test releases it (see the module docstring).

    Returns True if it paused. A no-op unless ``SPARKPOINT_TEST_PAUSE`` arms `point`
    (for `batch_id`, or for any batch when the spec names none). Each point pauses once
    per process.
    """
    armed = _pauses()
    if point not in armed or (armed[point] is not None and armed[point] != batch_id):
        return False
    directory = os.environ.get(PAUSE_DIR_ENV, "").strip()
    if not directory:
        raise ValueError(f"{PAUSE_ENV} arms {point!r} but {PAUSE_DIR_ENV} is not set")
    if point in _paused:
        return False
    _paused.add(point)
    os.makedirs(directory, exist_ok=True)
    reached = os.path.join(directory, f"{point}.reached")
    release = os.path.join(directory, f"{point}.release")
    body = {"pid": os.getpid(), "batch": batch_id, **{k: _plain(v) for k, v in details.items()}}
    tmp = reached + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(json.dumps(body))
    os.replace(tmp, reached)
    print(f"SPARKPOINT_TEST_PAUSE: paused at {point}:{batch_id}", flush=True)
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            log.warning("pause point %s was never released; going on after %.0f s", point, PAUSE_TIMEOUT_S)
            break
        time.sleep(0.05)
    print(f"SPARKPOINT_TEST_PAUSE: released at {point}:{batch_id}", flush=True)
    return True


_paused: set[str] = set()


def _plain(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _spark_submit_parent() -> int | None:
    """The pid of the parent process when it is spark-submit's JVM."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return None
    return parent if b"org.apache.spark.deploy.SparkSubmit" in cmdline else None


def _announce(line: str) -> None:
    """Print `line`; under spark-submit also append it to the JVM's own stdout. The Python
    driver's stdout is a pipe that the JVM relays, and the JVM is killed first: the
    relayed copy is often lost."""
    print(line, flush=True)
    parent = _spark_submit_parent()
    if parent is None:
        return
    try:
        with open(f"/proc/{parent}/fd/1", "a") as out:
            out.write(line + "\n")
    except OSError:
        pass


def kill_driver() -> None:
    """SIGKILL the JVM parent (when it is spark-submit's) and then this process."""
    parent = _spark_submit_parent()
    if parent is not None:
        os.kill(parent, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
