"""Waiting in tests: poll a condition until it holds, fail with what was awaited."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    predicate: Callable[[], T],
    timeout: float,
    context: Callable[[], str] | None = None,
    *,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    interval: float = 0.25,
    error: type[Exception] = AssertionError,
) -> T:
    """Poll `predicate` until it returns a truthy value; return that value.

    :param context: called for extra text (a log tail) for the failure message.
    :param proc: a process the wait depends on: its exit ends the wait at once.
    :raises error: `proc` exited, or `timeout` seconds passed; the message names `what`.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise error(f"the process exited ({proc.returncode}) while waiting for {what}{_extra(context)}")
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what}{_extra(context)}")
        time.sleep(interval)


def _extra(context: Callable[[], str] | None) -> str:
    text = context() if context is not None else ""
    return f"\n{text}" if text else ""
