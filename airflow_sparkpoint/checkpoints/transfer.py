"""Bounded parallel file transfers: the checkpoint's uploads, the restore's downloads,
a savepoint's copies.

Each transfer is one file's round trip (an upload to S3, a fsync on local disk), so a
checkpoint or restore of many files waits on latency, not bandwidth: a few at a time cut
its wall time without more memory (every transfer streams its file, none is read whole).

`transfer_all` keeps the callers' guarantees of the sequential loop it replaces:

- the results come back in the items' order and nothing of a failed run is reported as
  done: when one transfer fails, nothing new starts, the ones under way are waited for,
  and the first failure is raised (so the caller never writes ``_metadata`` after it);
- `check` (a deadline, a generation fence) runs in the caller's thread before each start;
- `on_half` (the caller's halfway fault: ``faults.maybe_kill(point, batch)``) runs once
  half the items are done; with `hold_at_half` (the fault is armed) the second half
  starts only after it, so a kill there leaves exactly half done, like the sequential
  loop's halfway kill;
- `on_done(done, total)` runs in the caller's thread, once per finished item, in order of
  completion.

A caller that transfers every few seconds (the checkpoint) passes a `pool` it keeps:
starting and stopping a pool's threads each time costs about a millisecond.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["THREADS", "ClosingPool", "transfer_all"]

T = TypeVar("T")
R = TypeVar("R")

#: files transferred at once. Not a configuration key (docs/reference/config.md lists the public ones):
#: 8 round trips in flight hide S3 latency on a few cores; local disk gains from
#: overlapping fsyncs and is not slowed by it.
THREADS = 8


class ClosingPool(Executor):
    """`pool` as one transfer run uses it, where the pool's owner may shut it down at any
    point: every submit after that raises ``closed()`` (say, "the run is ending")
    instead of the pool's RuntimeError.

    :raises Exception: ``closed()`` from `submit`, once the pool is shut down.
    """

    def __init__(self, pool: Executor, closed: Callable[[], Exception]) -> None:
        self._pool = pool
        self._closed = closed

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        try:
            return self._pool.submit(fn, *args, **kwargs)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raise self._closed() from None


def transfer_all(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    threads: int | None = None,
    check: Callable[[], None] | None = None,
    on_done: Callable[[int, int], None] | None = None,
    on_half: Callable[[], None] | None = None,
    hold_at_half: bool = False,
    pool: Executor | None = None,
) -> list[R]:
    """``[fn(item) for item in items]`` with up to `threads` calls at a time (see the
    module docstring for what is kept of the sequential loop), on `pool` if given (it
    must not be one `fn` itself waits on), else on a pool of this call's own.

    :raises Exception: the first exception raised by `fn` or `check`, or by `pool`'s
        ``submit`` (the transfers under way are waited for first).
    """
    total = len(items)
    results: list[R | None] = [None] * total
    if total == 0:
        return []
    halfway = max(1, total // 2)
    hold = halfway if hold_at_half else total  # how many may start before on_half ran
    workers = max(1, min(threads or THREADS, total))  # THREADS read now: a benchmark may set it
    done = 0
    failure: BaseException | None = None
    pending: dict[Future[R], int] = {}
    executor = pool or ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sparkpoint-transfer")
    try:
        submitted = 0
        while done < total:
            limit = total if done >= halfway else hold
            while failure is None and submitted < limit and len(pending) < workers:
                if check is not None:
                    try:
                        check()
                    except BaseException as exc:  # noqa: BLE001 - re-raised after the pool drains
                        failure = exc
                        break
                pending[executor.submit(fn, items[submitted])] = submitted
                submitted += 1
            if not pending:
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                error = future.exception()
                if error is not None:
                    failure = failure or error
                    continue
                results[index] = future.result()
                done += 1
                if failure is None:
                    if on_done is not None:
                        on_done(done, total)
                    if done == halfway and on_half is not None:
                        on_half()
            if failure is not None and not pending:
                break
    finally:
        # Never leave a transfer running behind the caller's back (it would write after
        # the caller reported the failure): wait for those under way.
        # A cancelled future counts as done only once a worker takes it off the queue: on
        # a shared pool that can be behind other work, so only the running ones are waited for.
        wait([future for future in pending if not future.cancel()])
        if pool is None:
            executor.shutdown(wait=True)
    if failure is not None:
        raise failure
    return results  # type: ignore[return-value]
