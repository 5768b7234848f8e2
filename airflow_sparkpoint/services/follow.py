"""Following a detached run through the catalog only (what the deferrable submit's
trigger does), deciding whether a resumed task re-attaches to its own run, and stopping
a detached run (a control cancel first, then its kill: the recorded process group of a
client-mode driver, the cluster manager's kill of a cluster-mode one).

A look (`RunFollower.look`) costs two store requests: the generation's own status record
(``status/<g>.json``, one GET) and whether a newer generation was claimed (one HEAD of
``generations/<g+1>``). A run is dead when its heartbeat stayed older than `dead_after`
on two looks in a row (a run that never wrote a status: `dead_after` after the first
look), or at once when its driver is known to be gone while its status still says it runs
(`DriverHandle.gone`: a process group recorded on this machine is empty, the cluster
manager reports the pod or application ended). No Airflow, no Spark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.catalog_types import GenerationInfo
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.history import live_status
from airflow_sparkpoint.checkpoints.history_records import AirflowTry, read_generation
from airflow_sparkpoint.checkpoints.status import JobStatus, read_job_status
from airflow_sparkpoint.exceptions import ConfigError, ControlError, SparkpointError, StorageError
from airflow_sparkpoint.services.runs import find_claim

__all__ = ["ENDED", "EVENT_STATUSES", "ClaimWait", "DriverHandle", "RunFollower", "StartedRun",
           "reattach_target", "stop_run", "stopping_target", "wait_for_claim"]

log = logging.getLogger(__name__)

#: a run's final states (`JobStatus.state`)
ENDED = ("finished", "stopped", "failed")
#: the ``status`` of the one event a follower reports
EVENT_STATUSES = ("success", "failed", "dead", "timeout")


class DriverHandle(Protocol):
    """Where a followed driver runs, as a follower watches and stops it: a detached
    client-mode process group (`services.detached.DriverProcess`) or a driver on the
    cluster (`services.cluster_manager.ClusterHandle`)."""

    def describe(self) -> str: ...

    def active(self) -> bool:
        """Whether it is known to still run."""
        ...

    def gone(self) -> bool:
        """Whether it is known to have ended (False when it cannot be told)."""
        ...

    def kill(self) -> str:
        """Kill it unless it ended; what was done (for the log). Never raises."""
        ...

    def where(self) -> dict[str, Any]:
        """What an event says about where it ran."""
        ...


@dataclass
class RunFollower:
    """Looks at run `generation` of the catalog's job until it ended or died."""

    catalog: Catalog
    generation: int
    dead_after: float
    process: DriverHandle | None = None
    #: `safe_look`: this many store errors in a row are the dead event
    max_errors: int = 15
    #: when a look first saw the run without a fresh heartbeat (or without a status), else None
    _stale_since: float | None = None
    _stale_looks: int = 0
    _errors: int = 0

    def safe_look(self, now: float | None = None) -> dict[str, Any] | None:
        """`look`, where a store that cannot be read is warned about and counted: after
        `max_errors` in a row, the ``dead`` event (the store, not the run, is unreachable)."""
        try:
            event = self.look(now)
        except StorageError as exc:
            self._errors += 1
            log.warning("look %d at job %s failed: %s", self._errors, self.catalog.job, exc)
            if self._errors >= self.max_errors:
                return self.event("dead", f"storage of job {self.catalog.job!r} unreachable ({self._errors} "
                                          f"looks in a row): {exc}")
            return None
        self._errors = 0
        return event

    def until_ended(self, poll_s: float, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """`safe_look` every `poll_s` seconds until the run is over; its event (blocking:
        a task that follows its run itself, where the trigger's loop is asynchronous)."""
        event = self.safe_look()
        while event is None:
            sleep(poll_s)
            event = self.safe_look()
        return event

    def look(self, now: float | None = None) -> dict[str, Any] | None:
        """One look (two store requests): the event when the run is over, else None.

        :raises StorageError: the store cannot be read.
        """
        now = time.time() if now is None else now
        status = read_job_status(self.catalog, self.generation)
        superseded = self.catalog.store.exists(layout.generation_key(self.generation + 1))
        if status is not None and status.generation == self.generation and status.state in ENDED:
            return self.ended(status)
        if superseded:
            return self.event("failed", f"generation {self.generation} of job {self.catalog.job!r} was "
                                        f"superseded: generation {self.generation + 1} was claimed "
                                        "(a later start fenced it)")
        if self.process is not None and self.process.gone():
            again = read_job_status(self.catalog, self.generation)  # it may have ended in between
            if again is not None and again.state in ENDED:
                return self.ended(again)
            return self.event("dead", f"the driver of generation {self.generation} of job "
                                      f"{self.catalog.job!r} is gone ({self.process.describe()}) "
                                      "without recording an end")
        fresh = status is not None and now - float(status.heartbeat_at) <= self.dead_after
        if fresh:
            self._stale_since, self._stale_looks = None, 0
            return None
        self._stale_looks += 1
        if self._stale_since is None:
            self._stale_since = now if status is None else min(now, float(status.heartbeat_at))
        if self._stale_looks >= 2 and now - self._stale_since > self.dead_after:
            heard = "never wrote a status" if status is None else \
                f"last heartbeat {now - float(status.heartbeat_at):.0f} s ago"
            return self.event("dead", f"the driver of generation {self.generation} of job "
                                      f"{self.catalog.job!r} is silent for more than {self.dead_after:.0f} s "
                                      f"({heard}): declared dead")
        return None

    def ended(self, status: JobStatus) -> dict[str, Any]:
        if status.state == "failed":
            return self.event("failed", status.error or f"generation {self.generation} of job "
                                                        f"{self.catalog.job!r} failed", state=status.state)
        return self.event("success", "", state=status.state)

    def event(self, status: str, message: str, **more: Any) -> dict[str, Any]:
        where = {} if self.process is None else self.process.where()
        return {"status": status, "generation": self.generation, "job": self.catalog.job, "message": message,
                "dead_after": self.dead_after, **where, **more}


def reattach_target(catalog: Catalog, starter: AirflowTry | None, *, own: Sequence[int] | None,
                    max_heartbeat_age: float, now: float | None = None) -> JobStatus | None:
    """The live run a resumption of task `starter` follows again instead of starting a new
    generation, or None: the job's live generation (`live_status`), started by the same
    task instance (its claim's Airflow identity), one of `own` (the task's recorded
    generations, when known), and with no stop or cancel request addressed to it (one
    there means the user ended it: a new start is wanted, see `stopping_target`).

    :raises StorageError: the store cannot be read.
    """
    status = _own_live(catalog, starter, own=own, max_heartbeat_age=max_heartbeat_age, now=now)
    return None if status is None or _stopping(catalog, status.generation) else status


def stopping_target(catalog: Catalog, starter: AirflowTry | None, *, own: Sequence[int] | None,
                    max_heartbeat_age: float, now: float | None = None) -> JobStatus | None:
    """The live run of task `starter` (as `reattach_target`) that a stop or cancel request
    addressed to it is ending (pending, or served while its end is not yet recorded): a new
    start of the task waits for its end (never two live runs), or None.

    :raises StorageError: the store cannot be read.
    """
    status = _own_live(catalog, starter, own=own, max_heartbeat_age=max_heartbeat_age, now=now)
    return status if status is not None and _stopping(catalog, status.generation) else None


def _own_live(catalog: Catalog, starter: AirflowTry | None, *, own: Sequence[int] | None,
              max_heartbeat_age: float, now: float | None) -> JobStatus | None:
    """The job's live run when task `starter` started it (one of `own`, when known)."""
    if starter is None:
        return None
    status = live_status(catalog, max_heartbeat_age, now=now)
    if status is None or (own is not None and status.generation not in own):
        return None
    running = read_generation(catalog, status.generation, status=status, current=status.generation).airflow
    return status if starter.same_task(running) else None


def _stopping(catalog: Catalog, generation: int) -> bool:
    """Whether a stop or cancel request addressed to `generation` is pending, taken by its
    run (acknowledged: the run is ending) or completed (a completed ``stop_after`` too)."""
    channel = ControlChannel(catalog)
    for request_id in channel.request_ids():
        try:
            request = channel.read_request(request_id)
            if request.generation != generation or request.kind not in ("stop", "cancel", "stop_after"):
                continue
            state = channel.result(request_id).state
        except ControlError as exc:
            log.debug("skipping control request %s of job %r: %s", request_id, catalog.job, exc)
            continue
        if state == "completed" or (request.kind != "stop_after" and state in ("pending", "acknowledged")):
            return True
    return False


def stop_run(catalog: Catalog, generation: int, process: DriverHandle | None, *, wait_s: float = 15.0,
             exit_s: float = 3.0, requested_by: str = "", poll_s: float = 1.0,
             sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """End run `generation`: a control cancel request to it (unless it already ended),
    up to `wait_s` seconds for its final status, up to `exit_s` more for its driver to
    exit, then its kill (`DriverHandle.kill`: SIGTERM/SIGKILL of a process group recorded
    on this machine; the cluster manager's kill of a driver on the cluster, which leaves
    one that ended alone). Returns what happened, line by line. Never raises (a stop is best effort;
    every failure is in the lines).
    """
    lines: list[str] = []

    def final() -> JobStatus | None:
        try:
            status = read_job_status(catalog, generation)
        except SparkpointError as exc:
            lines.append(f"could not read the status of generation {generation}: {exc}")
            return None
        return status if status is not None and status.state in ENDED else None

    ended = final()
    if ended is None:
        try:
            request = ControlChannel(catalog).submit("cancel", generation=generation,
                                                     timeout_s=max(wait_s, 1.0), requested_by=requested_by)
            lines.append(f"cancel request {request.id} written to generation {generation} "
                         f"of job {catalog.job!r}")
        except (ConfigError, SparkpointError) as exc:
            lines.append(f"could not write a cancel request to generation {generation}: {exc}")
        deadline = time.monotonic() + wait_s
        while ended is None and time.monotonic() < deadline:
            sleep(poll_s)
            ended = final()
    if ended is not None:
        lines.append(f"generation {generation} ended: {ended.state}")
    else:
        lines.append(f"generation {generation} recorded no end within {wait_s:.0f} s")
    if process is not None:
        deadline = time.monotonic() + (exit_s if ended is not None else 0.0)
        while time.monotonic() < deadline and process.active():
            sleep(min(poll_s, 0.2))
        lines.append(process.kill())
    return lines


@dataclass
class StartedRun:
    """A run a task started on a driver no signal of the task reaches (a driver on the
    cluster) and follows itself: its `driver` and, once claimed, its `generation`; what
    the task's ``on_kill`` ends (`stop`)."""

    catalog: Catalog
    driver: DriverHandle
    generation: int | None = None

    def stop(self, *, wait_s: float, requested_by: str, exit_s: float = 1.0) -> list[str]:
        """A control cancel to its generation, up to `wait_s` seconds for its end, then the
        driver's kill, `exit_s` after a recorded end (`stop_run`); before the claim the kill
        only: there is no generation to address. Never raises."""
        if self.generation is None:
            return [self.driver.kill()]
        return stop_run(self.catalog, self.generation, self.driver, wait_s=wait_s, exit_s=exit_s, poll_s=0.5,
                        requested_by=requested_by)


@dataclass(frozen=True)
class ClaimWait:
    """How the wait for a launched driver's generation claim ended: its `claim`, or None
    with `why` (``"ended"``: the driver is gone without claiming; ``"timeout"``: it was
    then killed, `killed` says how, for the log)."""

    claim: GenerationInfo | None
    why: str = ""
    killed: str = ""


def wait_for_claim(catalog: Catalog, token: str, since: int, driver: DriverHandle, *, timeout_s: float,
                   poll_s: float = 1.0, look_every: int = 1, sleep: Callable[[float], None] = time.sleep,
                   warn: Callable[[str], None] = log.warning) -> ClaimWait:
    """Wait for the generation claim of the driver launched with submit token `token`
    (claims after generation `since`), asking `driver` whether it is gone every
    `look_every` polls (a cluster manager's API is not asked every second); a store that
    cannot be read is warned about and tried again. A driver that claimed nothing within
    `timeout_s` is killed (`DriverHandle.kill`, which never raises): the task gives up on
    it, and nothing else would stop it."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        try:
            claim = find_claim(catalog, token, after=since)
        except SparkpointError as exc:
            warn(f"could not read the generation claims of job {catalog.job}: {exc}")
            claim = None
        if claim is not None:
            return ClaimWait(claim)
        if polls % max(1, look_every) == 0 and driver.gone():
            try:  # it may have claimed and ended in between
                claim = find_claim(catalog, token, after=since)
            except SparkpointError:
                claim = None
            return ClaimWait(claim) if claim is not None else ClaimWait(None, "ended")
        if time.monotonic() > deadline:
            return ClaimWait(None, "timeout", driver.kill())
        polls += 1
        sleep(poll_s)
