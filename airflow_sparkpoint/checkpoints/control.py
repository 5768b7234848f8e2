"""The control channel: savepoint / stop / cancel requests from outside a running job.

A requester (the CLI, the savepoint operator) writes a request; the running job polls
for pending requests between micro-batches, *acknowledges* one (an atomic create, so
two jobs never both take it), acts on it and writes the result. Everything is JSON
under ``<job>/control/``::

    control/<id>.request.json   ControlRequest    written once by the requester
    control/<id>.ack.json       the claim         put_if_absent: by a job (acknowledged),
                                                  by a waiter that gave up (expired), or
                                                  by fail() on an unclaimed request
    control/<id>.result.json    ControlResult     put_if_absent: completed / failed / expired

The ack file is the single arbitration point: whoever creates it owns the request's
outcome. A waiter that times out, or sees the job die, claims a still-unacknowledged
request as expired, so a job started later never acts on a request nobody waits for.

Every request names the generation it is meant for (the live run's, from its status
record). A run serves only requests addressed to its own generation, and when it
starts it withdraws (expires, with the reason) the pending requests addressed to older
generations or to none (records of earlier releases): a request whose run is gone is
never served by a successor (a killed try's stop request must not stop the retry).

Request ids sort by time: ``<13-digit epoch ms>-<8 hex>``.

States reported by `ControlChannel.result`::

    pending ──acknowledge──> acknowledged ──complete──> completed
       │                          └────────fail──────> failed
       └── deadline passed / withdrawn ──────────────> expired
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.control_records import (  # re-exported: callers import them from here
    FILE_RE,
    KINDS,
    REQUEST_ID_RE,
    SCHEMA_VERSION,
    STATES,
    ControlClaim,
    ControlRequest,
    ControlResult,
    ack_key,
    check_kind,
    check_request_id,
    new_request_id,
    request_created_at,
    request_key,
    result_key,
)
from airflow_sparkpoint.checkpoints.display import iso
from airflow_sparkpoint.exceptions import (
    ConfigError,
    ControlError,
    CorruptRecord,
    InvalidPath,
    ObjectExists,
    RestoreError,
)

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["KINDS", "REQUEST_ID_RE", "SCHEMA_VERSION", "STATES", "ControlChannel", "ControlRequest",
           "ControlResult", "new_request_id"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ControlChannel:
    """Submit, take and answer control requests of one job (see the module docstring)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.store = catalog.store
        #: the clock (a seam for tests)
        self.clock: Callable[[], float] = time.time
        self._requests: dict[str, ControlRequest] = {}  # immutable once written: cache them

    # ------------------------------------------------------------------ requester side

    def submit(
        self,
        kind: str,
        *,
        generation: int,
        timeout_s: float = 600.0,
        requested_by: str = "",
        after_batch: int | None = None,
        cutover: str | None = None,
    ) -> ControlRequest:
        """Write a new request for run `generation`; it expires `timeout_s` seconds from now.
        A ``stop_after`` request names `after_batch`, the last batch the run may stage,
        and `cutover`, the zero-downtime cutover it is filed for (if any).

        :raises ConfigError: unknown `kind`, non-positive `timeout_s`, `generation`
            missing or not an integer >= 1, or `after_batch` missing or negative for
            ``stop_after`` (given for another kind), or `cutover` given for another kind.
        """
        if kind not in KINDS:
            raise ConfigError(f"control request kind {kind!r} is invalid; expected one of {', '.join(KINDS)}")
        try:
            check_kind(kind, after_batch)
        except ControlError as exc:
            raise ConfigError(str(exc)) from None
        if cutover is not None and (kind != "stop_after" or not isinstance(cutover, str) or not cutover):
            raise ConfigError(f"cutover={cutover!r} belongs to stop_after requests (a cutover id), not to a "
                              f"{kind} request")
        if generation is None:
            raise ConfigError(
                f"a {kind} request needs generation=<the live run's generation> (see `sparkpoint status`): "
                "a request for whichever run is current could be served by a later run it was not meant for"
            )
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ConfigError(f"control request timeout_s={timeout_s!r} is invalid; "
                              "expected a number of seconds > 0")
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
            raise ConfigError(f"control request generation={generation!r} is invalid; "
                              "expected an integer >= 1")
        now = self.clock()
        request = ControlRequest(
            id=new_request_id(now),
            kind=kind,
            job=self.catalog.job,
            created_at=now,
            deadline=now + float(timeout_s),
            generation=generation,
            requested_by=str(requested_by),
            after_batch=after_batch,
            cutover=cutover,
        )
        self.store.put_if_absent(request_key(request.id),
                                 json.dumps(request.to_json(), sort_keys=True).encode())
        self._requests[request.id] = request
        log.info("submitted %s request %s to job %r (deadline in %.0f s)", kind, request.id,
                 self.catalog.job, timeout_s)
        return request

    def result(self, request_id: str) -> ControlResult:
        """Where request `request_id` stands.

        :raises ControlError: there is no such request, or its records are unreadable.
        """
        return self._resolve(request_id)[0]

    def _resolve(self, request_id: str) -> tuple[ControlResult, bool]:
        """(the result, whether it is only derived from the clock: expired but not yet sealed)."""
        check_request_id(request_id)
        stored = self._stored_result(request_id)
        if stored is not None:
            return stored, False
        claim = self._claim(request_id)
        if claim is not None:
            result = ControlResult(request_id, claim.state, claim.generation, error=claim.reason or None,
                                   updated_at=claim.at)
            return result, False
        request = self._request(request_id)
        if request.expired(self.clock()):
            return ControlResult(request_id, "expired", request.generation, error=_unacknowledged(request),
                                 updated_at=request.deadline), True
        return ControlResult(request_id, "pending", request.generation, updated_at=request.created_at), False

    def wait(
        self,
        request_id: str,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        is_alive: Callable[[], bool] | None = None,
    ) -> ControlResult:
        """Block until request `request_id` completes and return its result.

        :raises ControlError: it failed or expired, `timeout_s` passed, or `is_alive()`
            returned False (the job died); the message names the request, job and why.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
            raise ConfigError(f"wait timeout_s={timeout_s!r} is invalid; expected a number of seconds >= 0")
        if isinstance(poll_s, bool) or not isinstance(poll_s, (int, float)) or not poll_s > 0:
            raise ConfigError(f"wait poll_s={poll_s!r} is invalid; expected a number of seconds > 0")
        request = self._request(request_id)
        what = f"{request.kind} request {request_id} of job {self.catalog.job!r}"
        give_up_at = time.monotonic() + timeout_s
        while True:
            current, unsealed = self._resolve(request_id)
            if unsealed:  # expired by the clock: seal it, so a job with a slow clock cannot take it now
                current = self._withdraw(request, _unacknowledged(request))
            if current.finished:
                return self._outcome(what, current)
            if is_alive is not None and not is_alive():
                current = self.result(request_id)  # it may have finished just before the job exited
                if current.state == "pending":
                    current = self._withdraw(request, "the job is not running")
                    if current.state == "expired":
                        raise ControlError(
                            f"{what} was not taken: the job is not running (no live run with a fresh "
                            "heartbeat; see `sparkpoint status`); the request was withdrawn"
                        )
                if current.finished:
                    return self._outcome(what, current)
                raise ControlError(
                    f"{what} was acknowledged by generation {current.generation} but the job stopped "
                    "before finishing it (see `sparkpoint status` and the job's driver log)"
                )
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                if current.state == "pending":
                    current = self._withdraw(request, f"the requester stopped waiting after {timeout_s:g} s")
                    if current.state == "expired":
                        raise ControlError(
                            f"{what} timed out after {timeout_s:g} s: no job acknowledged it (is the job "
                            "running and polling for control requests?); the request was withdrawn"
                        )
                if current.finished:
                    return self._outcome(what, current)
                raise ControlError(
                    f"{what} timed out after {timeout_s:g} s: acknowledged by "
                    f"generation {current.generation} "
                    f"but not finished; it may still complete (check `sparkpoint status`)"
                )
            time.sleep(min(poll_s, remaining))

    def _outcome(self, what: str, result: ControlResult) -> ControlResult:
        if result.state == "completed":
            return result
        if result.state == "failed":
            by = f" in generation {result.generation}" if result.generation is not None else ""
            raise ControlError(f"{what} failed{by}: {result.error or 'no reason given'}")
        raise ControlError(f"{what} expired: {result.error or 'nobody acknowledged it in time'}")

    def withdraw(self, request_id: str, reason: str) -> ControlResult:
        """Withdraw request `request_id` if no run took it yet (it expires with `reason`);
        return where it stands. A request a run already acknowledged is left to finish.

        :raises ControlError: there is no such request, or its records are unreadable.
        """
        request = self._request(request_id)
        current = self.result(request_id)
        if current.state != "pending":
            return current
        return self._withdraw(request, reason)

    def _withdraw(self, request: ControlRequest, reason: str) -> ControlResult:
        """Claim an unacknowledged request as expired, so no job takes it later."""
        now = self.clock()
        try:
            self.store.put_if_absent(ack_key(request.id),
                                     ControlClaim("expired", None, now, reason).to_bytes(request.id))
        except ObjectExists:
            return self.result(request.id)  # a job took it in the meantime
        self._put_result(ControlResult(request.id, "expired", request.generation, error=reason,
                                       updated_at=now))
        log.info("withdrew control request %s of job %r: %s", request.id, self.catalog.job, reason)
        return self.result(request.id)

    # ------------------------------------------------------------------ job side

    def pending(self, generation: int | None = None) -> list[ControlRequest]:
        """Requests nobody took yet and that have not expired, oldest first.

        With `generation`, only the requests addressed to that generation (what its run
        serves); without, every pending request.
        """
        ids, taken = self._scan()
        now = self.clock()
        result = []
        for request_id in ids:
            if request_id in taken:
                continue
            try:
                request = self._request(request_id)
            except ControlError as exc:
                log.warning("ignoring control request %s of job %r: %s", request_id, self.catalog.job, exc)
                continue
            if request.expired(now) or request.job != self.catalog.job:
                continue
            if generation is not None and request.generation != generation:
                continue
            result.append(request)
        return sorted(result, key=lambda r: (r.created_at, r.id))

    def withdraw_superseded(self, generation: int) -> list[str]:
        """Withdraw every pending request addressed to a generation older than
        `generation`, or to none; return their ids. Called by run `generation` when it
        starts: those requests' runs are gone (superseded), and no successor serves them.
        """
        withdrawn = []
        for request in self.pending():
            if request.generation is not None and request.generation >= generation:
                continue
            why = (
                "addressed to no generation (written by an earlier release)" if request.generation is None
                else f"addressed to generation {request.generation}, superseded by generation {generation}"
            )
            reason = f"{why}: that run is gone, and generation {generation} does not serve it"
            if self._withdraw(request, reason).state == "expired":
                withdrawn.append(request.id)
        return withdrawn

    def acknowledge(self, request: ControlRequest, generation: int) -> None:
        """Take `request` for `generation` (atomic create of the ack).

        :raises ObjectExists: another job (or a waiter that gave up) took it first.
        :raises ControlError: it is expired or addressed to another generation.
        """
        if request.generation is None:
            raise ControlError(
                f"{request.kind} request {request.id} of job {self.catalog.job!r} is "
                "addressed to no generation; "
                f"generation {generation} does not serve it"
            )
        if request.generation != generation:
            raise ControlError(
                f"{request.kind} request {request.id} of job {self.catalog.job!r} is addressed to generation "
                f"{request.generation}, not {generation}"
            )
        now = self.clock()
        if request.expired(now):
            raise ControlError(
                f"{request.kind} request {request.id} of job {self.catalog.job!r} expired at "
                f"{_iso(request.deadline)}"
            )
        self.store.put_if_absent(ack_key(request.id),
                                 ControlClaim("acknowledged", generation, now).to_bytes(request.id))
        log.info("generation %d of job %r acknowledged %s request %s", generation, self.catalog.job,
                 request.kind, request.id)

    def complete(
        self,
        request: ControlRequest,
        *,
        generation: int,
        savepoint: str | None = None,
        batch_id: int | None = None,
        checkpoint: str | None = None,
    ) -> None:
        """Record success (`checkpoint`: the final checkpoint of a ``stop_after``). The
        request must have been acknowledged by `generation`.

        :raises ControlError: it was not acknowledged by `generation`, or already has
            a different result.
        """
        claim = self._claim(request.id)
        if claim is None or claim.state != "acknowledged" or claim.generation != generation:
            owner = "nobody" if claim is None else (
                f"generation {claim.generation}" if claim.state == "acknowledged"
                else f"the requester ({claim.state})"
            )
            raise ControlError(
                f"cannot complete {request.kind} request {request.id} of job "
                f"{self.catalog.job!r} as generation "
                f"{generation}: it was taken by {owner}"
            )
        self._put_result(ControlResult(request.id, "completed", generation, savepoint, batch_id, None,
                                       self.clock(), checkpoint))

    def fail(self, request: ControlRequest, *, generation: int | None, error: str) -> None:
        """Record failure; an unacknowledged request is claimed first so no job takes it.

        :raises ControlError: another generation owns the request, or it already has a
            different result.
        """
        now = self.clock()
        claim = self._claim(request.id)
        if claim is None:
            try:
                self.store.put_if_absent(ack_key(request.id),
                                         ControlClaim("failed", generation, now, error).to_bytes(request.id))
            except ObjectExists:
                pass
            claim = self._claim(request.id)
        if (
            claim is not None
            and claim.state == "acknowledged"
            and generation is not None
            and claim.generation != generation
        ):
            raise ControlError(
                f"cannot fail {request.kind} request {request.id} of job {self.catalog.job!r} as generation "
                f"{generation}: it was taken by generation {claim.generation}"
            )
        self._put_result(ControlResult(request.id, "failed", generation, None, None, str(error), now))

    # ------------------------------------------------------------------ housekeeping

    def cleanup(self, older_than_s: float = 86400, *, limit: int | None = None) -> int:
        """Delete the files of requests that finished (or expired) more than
        `older_than_s` seconds ago and whose deadline passed as long ago, the oldest first
        and at most `limit` of them; return how many requests were removed. Pending
        requests and requests a job is still working on are kept. A request created less
        than `older_than_s` ago is skipped without reading it (it cannot have finished
        earlier than it was made).

        :raises ConfigError: `older_than_s` < 0 or `limit` < 1.
        """
        if (isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float))
                or not older_than_s >= 0):
            raise ConfigError(f"cleanup older_than_s={older_than_s!r} is invalid; expected "
                              "a number of seconds >= 0")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"cleanup limit={limit!r} is invalid; expected an integer >= 1 or None")
        now = self.clock()
        by_id: dict[str, list[str]] = {}
        for info in self.store.list(layout.CONTROL):
            match = FILE_RE.match(info.key.rsplit("/", 1)[-1])
            if match:
                by_id.setdefault(match.group(1), []).append(info.key)
        removed = 0
        for request_id, keys in sorted(by_id.items()):  # ids sort by creation time
            if limit is not None and removed >= limit:
                break
            if now - request_created_at(request_id) < older_than_s:
                break  # ordered by creation: every later one is younger still
            finished_at = self._finished_at(request_id, keys)
            if finished_at is not None and now - finished_at >= older_than_s:
                # The request file last: until it is gone the id stays visible.
                self.store.delete(sorted(keys, key=lambda k: k.endswith(".request.json")))
                self._requests.pop(request_id, None)
                removed += 1
        if removed:
            log.info("removed %d finished control requests of job %r", removed, self.catalog.job)
        return removed

    def _finished_at(self, request_id: str, keys: list[str]) -> float | None:
        """When the request reached a final state and its deadline passed, or None while it
        is still live. Not before the deadline: a removal cut short leaves the request file
        last, and an unexpired request file without its ack would be served again."""
        try:
            stored = self._stored_result(request_id)
        except ControlError:
            stored = None
        try:
            request = self._request(request_id)
        except ControlError:  # an orphaned ack/result, or an unreadable request: age by the id
            return stored.updated_at if stored is not None else request_created_at(request_id)
        if stored is not None:
            return max(stored.updated_at, request.deadline)
        if self.clock() > request.deadline:
            return request.deadline
        return None

    # ------------------------------------------------------------------ reading

    def request_ids(self) -> list[str]:
        """Ids of every stored request, answered or not."""
        return self._scan()[0]

    def stopped(self, generation: int) -> bool:
        """Whether a stop, cancel or stop_after request addressed to `generation` completed:
        that run is ending (a stop-with-savepoint took its savepoint; it writes its final status
        moments later). Unreadable requests are skipped."""
        ids, taken = self._scan()
        for request_id in (i for i in ids if i in taken):
            try:
                request = self._request(request_id)
                if request.kind in ("stop", "cancel", "stop_after") and request.generation == generation and \
                        self.result(request_id).state == "completed":
                    return True
            except ControlError as exc:
                log.debug("skipping control request %s of job %r: %s", request_id, self.catalog.job, exc)
        return False

    def read_request(self, request_id: str) -> ControlRequest:
        """Request `request_id` (cached once read).

        :raises ControlError: it does not exist or is unreadable.
        """
        return self._request(request_id)

    def _scan(self) -> tuple[list[str], set[str]]:
        """(ids of every request file, ids that are acknowledged or have a result)."""
        ids: list[str] = []
        taken: set[str] = set()
        for info in self.store.list(layout.CONTROL):
            match = FILE_RE.match(info.key.rsplit("/", 1)[-1])
            if not match:
                continue
            if match.group(2) == "request":
                ids.append(match.group(1))
            else:
                taken.add(match.group(1))
        return ids, taken

    def _request(self, request_id: str) -> ControlRequest:
        check_request_id(request_id)
        cached = self._requests.get(request_id)
        if cached is not None:
            return cached
        key = request_key(request_id)
        request = self._read(key, ControlRequest.from_json)
        if request is None:
            raise ControlError(
                f"control request {request_id} of job {self.catalog.job!r} does not exist "
                f"under {self.catalog.uri}"
            )
        if request.id != request_id:
            raise ControlError(f"{self.catalog.uri}/{key} holds request {request.id!r}, not {request_id!r}")
        self._requests[request_id] = request
        return request

    def _claim(self, request_id: str) -> ControlClaim | None:
        return self._read(ack_key(request_id), ControlClaim.from_json)

    def _read(self, key: str, parse: Callable[[Any], T]) -> T | None:
        """The control record at `key` as `parse` makes it (None: there is none).

        :raises ControlError: it is unreadable or over its limits; the message names it.
        """
        try:
            return bounded.read_record(self.store, key, parse, limits=layout.limits_of(key),
                                       where=f"{self.catalog.uri}/{key}")
        except CorruptRecord as exc:
            raise ControlError(f"unreadable control record {exc}") from None

    def _stored_result(self, request_id: str) -> ControlResult | None:
        key = result_key(request_id)
        result = self._read(key, ControlResult.from_json)
        if result is None:
            return None
        try:  # read from the store: it may only name one of this job's savepoints
            if result.savepoint is not None:
                self.catalog.snapshot_key(result.savepoint, savepoint_only=True)
        except (InvalidPath, RestoreError) as exc:
            raise ControlError(f"{self.catalog.uri}/{key} names savepoint "
                               f"{result.savepoint!r}, not one of job "
                               f"{self.catalog.job!r}'s savepoints: {exc}") from None
        try:  # and only one of this job's checkpoints
            if result.checkpoint is not None:
                self.catalog.snapshot_key(result.checkpoint)
        except (InvalidPath, RestoreError) as exc:
            raise ControlError(f"{self.catalog.uri}/{key} names checkpoint {result.checkpoint!r}, not one of "
                               f"job {self.catalog.job!r}'s: {exc}") from None
        return result

    def _put_result(self, result: ControlResult) -> None:
        """Write the final result once; repeating the same outcome is a no-op."""
        body = json.dumps(result.to_json(), sort_keys=True).encode("utf-8")
        try:
            self.store.put_if_absent(result_key(result.request_id), body)
        except ObjectExists:
            existing = self._stored_result(result.request_id)
            if (existing is not None
                    and (existing.state, existing.generation) == (result.state, result.generation)):
                return
            shown = "unreadable" if existing is None else existing.state
            raise ControlError(
                f"control request {result.request_id} of job {self.catalog.job!r} already has a result "
                f"({shown}); cannot record {result.state}"
            ) from None


def _unacknowledged(request: ControlRequest) -> str:
    return (
        f"nobody acknowledged it within its timeout of {request.deadline - request.created_at:g} s "
        "(is the job running and polling for control requests?)"
    )


def _iso(epoch: float) -> str:
    return iso(epoch) or ""
