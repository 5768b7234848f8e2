"""Savepoint history retention, like the Flink Kubernetes operator's
``kubernetes.operator.savepoint.history.max.count`` / ``.max.age``.

Checkpoint retention (``numRetained`` plus reference-counted shared files) lives in
`Catalog.enforce_retention`; savepoints are never touched by it. This module is the
opt-in policy for savepoints: keep at most `max_count` of them and none older than
`max_age_s`, but always keep the newest valid one, so a deploy can still roll back.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from airflow_sparkpoint.exceptions import ConfigError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

log = logging.getLogger(__name__)

#: an incomplete savepoint directory (no ``_metadata``) younger than this may still be
#: being written; older ones are abandoned copies and are removed
INCOMPLETE_GRACE_S = 3600.0


def _check_args(max_count: int | None, max_age_s: float | None) -> None:
    if max_count is not None and (isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1):
        raise ConfigError(
            f"savepoint history max_count={max_count!r} is invalid; expected an integer >= 1 or None (no limit)"
        )
    if max_age_s is not None and (
        isinstance(max_age_s, bool)
        or not isinstance(max_age_s, (int, float))
        or not math.isfinite(max_age_s)
        or max_age_s <= 0
    ):
        raise ConfigError(
            f"savepoint history max_age_s={max_age_s!r} is invalid; expected a number of seconds > 0 or None (no limit)"
        )


def savepoint_history_retention(
    catalog: Catalog,
    *,
    max_count: int | None,
    max_age_s: float | None,
    now: float | None = None,
) -> list[str]:
    """Dispose of savepoints beyond the `max_count` newest or older than `max_age_s`;
    return the URIs disposed of, newest first.

    The newest valid savepoint is always kept. Incomplete savepoint directories (no
    ``_metadata``) untouched for more than an hour are removed too. A savepoint whose
    ``_metadata`` exists but does not validate is left alone and reported in a warning:
    it may be evidence, and `sparkpoint dispose` removes it on purpose.

    :raises ConfigError: `max_count` or `max_age_s` is not a positive number (or None).
    """
    _check_args(max_count, max_age_s)
    now = time.time() if now is None else now
    entries = catalog.list_savepoints()
    valid = sorted((e for e in entries if e.metadata is not None),
                   key=lambda e: (e.metadata.created_at if e.metadata else 0.0, e.id), reverse=True)
    disposed: list[str] = []
    for index, entry in enumerate(valid):
        assert entry.metadata is not None
        if index == 0:
            continue  # always keep the newest valid savepoint
        age = now - entry.metadata.created_at
        reason = None
        if max_count is not None and index >= max_count:
            reason = f"beyond the {max_count} newest"
        elif max_age_s is not None and age > max_age_s:
            reason = f"{age:.0f} s old, max age {max_age_s:g} s"
        if reason:
            catalog.dispose(entry.key)
            log.info("disposed savepoint %s (%s)", entry.uri, reason)
            disposed.append(entry.uri)
    for entry in entries:
        if entry.metadata is not None:
            continue
        if entry.error and "no _metadata" in entry.error:
            newest = max((info.mtime for info in catalog.store.list(entry.key)), default=None)
            if newest is not None and now - newest > INCOMPLETE_GRACE_S:
                catalog.dispose(entry.key)
                log.info("removed incomplete savepoint %s (untouched for %.0f s)", entry.uri, now - newest)
                disposed.append(entry.uri)
        else:
            log.warning("keeping invalid savepoint %s for inspection: %s (remove it with `sparkpoint dispose`)",
                        entry.uri, entry.error)
    return disposed
