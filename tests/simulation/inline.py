"""Stand-ins for the product's helper threads in the simulation: each runs its work at
once in the calling actor (the scheduler knows of no other line of execution)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from tests.simulation.scheduler import Crash


class InlineExecutor(Executor):
    """An executor that runs each call at once in the caller's thread (the simulation has
    one greenlet per actor; transfer pools would add threads the scheduler does not know)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Crash:
            raise
        except BaseException as exc:  # noqa: BLE001 - the future carries it, as a pool's would
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


class InlineThread:
    """A `threading.Thread` stand-in whose `start` runs the target at once."""

    def __init__(self, target: Callable[..., Any] | None = None, args: tuple[Any, ...] = (),
                 kwargs: dict[str, Any] | None = None, **_: Any) -> None:
        self._target, self._args, self._kwargs = target, args, kwargs or {}
        self._done = False

    def start(self) -> None:
        try:
            if self._target is not None:
                self._target(*self._args, **self._kwargs)
        finally:
            self._done = True

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return False
