"""Manage control requests from outside a running job: list the open ones, withdraw one
no run took yet, and look at or settle one a waiter filed (the savepoint operator's
trigger). The requests themselves, and how a run takes and answers them, are the
control channel's (`checkpoints.control`). Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints.control import (
    REQUEST_ID_RE,
    ControlChannel,
    ControlRequest,
    ControlResult,
)
from airflow_sparkpoint.checkpoints.history import generation_alive, open_requests
from airflow_sparkpoint.exceptions import ControlError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = [
    "REQUEST_ID_RE", "ControlRequest", "ControlResult", "RequestOutcome", "look_at_request", "open_requests",
    "settle_request", "withdraw_request",
]


def withdraw_request(catalog: Catalog, request_id: str, reason: str) -> ControlResult:
    """Withdraw request `request_id` of `catalog`'s job if no run took it yet (it expires
    with `reason`, and no run takes it later); return where it stands (a request a run
    already acknowledged runs to its end).

    :raises ControlError: there is no such request, or its records are unreadable.
    """
    return ControlChannel(catalog).withdraw(request_id, reason)


@dataclass(frozen=True)
class RequestOutcome:
    """Where a savepoint or stop request a waiter filed stands: `result` once it completed
    with a savepoint, `error` once it cannot (failed, expired, the run stopped); neither
    while it is pending or being served."""

    result: ControlResult | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


def look_at_request(catalog: Catalog, request_id: str, *, generation: int | None, max_heartbeat_age: float,
                    poll_s: float) -> tuple[RequestOutcome, ControlResult]:
    """One look at request `request_id`, addressed to run `generation`: the outcome, and
    the request's state as read. When that run is no longer live, the channel settles the
    request (a result written just before the run exited, or the withdrawal of a request
    nobody will take).

    :raises ControlError: there is no such request, or its records are unreadable.
    :raises StorageError: the store cannot be read.
    """
    channel = ControlChannel(catalog)
    result = channel.result(request_id)
    if result.finished:
        return _outcome(channel, catalog.job, result, poll_s), result
    if not generation_alive(catalog, generation, max_heartbeat_age):
        return _settle(channel, catalog.job, request_id, poll_s, lambda: False), result
    return RequestOutcome(), result


def settle_request(catalog: Catalog, request_id: str, *, poll_s: float,
                   is_alive: Callable[[], bool] | None) -> RequestOutcome:
    """The outcome of request `request_id` now, its waiter giving up (at its deadline, or
    with `is_alive` saying the run stopped): a request no run took is withdrawn.

    :raises StorageError: the store cannot be read.
    """
    return _settle(ControlChannel(catalog), catalog.job, request_id, poll_s, is_alive)


def _settle(channel: ControlChannel, job: str, request_id: str, poll_s: float,
            is_alive: Callable[[], bool] | None) -> RequestOutcome:
    try:
        result = channel.wait(request_id, timeout_s=0, poll_s=poll_s, is_alive=is_alive)
    except ControlError as exc:
        return RequestOutcome(error=str(exc))
    return _outcome(channel, job, result, poll_s)


def _outcome(channel: ControlChannel, job: str, result: ControlResult, poll_s: float) -> RequestOutcome:
    if result.state != "completed":
        try:
            channel.wait(result.request_id, timeout_s=0, poll_s=poll_s)
        except ControlError as exc:
            return RequestOutcome(error=str(exc))
        return RequestOutcome(error=f"control request {result.request_id} of job "
                                    f"{job!r} ended {result.state}")
    if not result.savepoint:
        return RequestOutcome(error=f"control request {result.request_id} of job {job!r} completed without a "
                                    "savepoint path")
    return RequestOutcome(result=result)
