"""The progress record of a shadow run (`runtime.follow`): how far behind blue it is.

``<shadow root>/<shadow job>/follow.json``, overwritten after every replayed batch (one
writer: the shadow's driver). The Airflow side (a cutover's agreement step) reads it to
decide when green is close enough to blue: `behind` batches, `seconds_per_batch` against
blue's trigger interval. Pure Python, no Spark.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.storage import Storage

__all__ = ["DIFFERENCE_MAX_CHARS", "SCHEMA_VERSION", "STATES", "FollowProgress", "read_follow",
           "write_follow"]

SCHEMA_VERSION = 1
#: following: replaying; caught_up: replayed every batch blue recorded so far; ended:
#: blue ended (or the until batch was reached) and everything was replayed; failed: see error
STATES = ("following", "caught_up", "ended", "failed")
#: a comparison's first differing rows are clipped to this many characters
DIFFERENCE_MAX_CHARS = 16 * 1024


@dataclass(frozen=True)
class FollowProgress:
    """A shadow's position behind blue (see the module docstring)."""

    shadow_job: str
    blue_job: str
    mode: str
    state: str
    #: blue's checkpoint the warm-up restored (its uri and batch K)
    started_from: str
    started_batch: int
    #: the newest batch of blue replayed (K while none was)
    last_replayed: int
    #: the newest batch blue recorded (staged or committed) when last looked at
    blue_last_batch: int | None
    #: mean seconds per replayed batch over the last few (None before the first)
    seconds_per_batch: float | None
    #: batches replayed from a pending record whose commit since matched (compare: and rows)
    verified_through: int
    #: compare mode: the batches compared equal with blue's committed output, through this one
    compared_through: int | None = None
    #: compare mode: the first difference (batch and rows), or None
    difference: str | None = None
    error: str | None = None
    updated_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    @property
    def behind(self) -> int | None:
        """Batches blue recorded that the shadow has not replayed yet."""
        return None if self.blue_last_batch is None else max(0, self.blue_last_batch - self.last_replayed)

    def with_(self, **changes: Any) -> FollowProgress:
        return replace(self, updated_at=time.time(), **changes)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "behind": self.behind}

    @classmethod
    def from_json(cls, body: Any) -> FollowProgress:
        """:raises ValueError: not a progress record of a known schema."""
        if not isinstance(body, dict) or body.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a follow progress record of schema version 1")
        known = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}
        progress = cls(**known)
        if progress.state not in STATES:
            raise ValueError(f"unknown follow state {progress.state!r}; expected one of {', '.join(STATES)}")
        return progress


def write_follow(store: Storage, progress: FollowProgress) -> None:
    """Overwrite the shadow job's progress record (`store`: the shadow job's own store).

    :raises CatalogError: the record would be over its limits."""
    if progress.difference is not None:
        progress = replace(progress, difference=bounded.clip(progress.difference, DIFFERENCE_MAX_CHARS))
    if progress.error is not None:
        progress = replace(progress, error=bounded.clip(progress.error, DIFFERENCE_MAX_CHARS))
    body = json.dumps(progress.to_json(), sort_keys=True).encode()
    bounded.check_writable(body, layout.limits_of(layout.FOLLOW), layout.FOLLOW)
    store.put(layout.FOLLOW, body)


def read_follow(store: Storage) -> FollowProgress | None:
    """The shadow job's progress record, or None when it wrote none.

    :raises CorruptRecord: it is unreadable."""
    return bounded.read_record(store, layout.FOLLOW, FollowProgress.from_json,
                               limits=layout.limits_of(layout.FOLLOW), where=layout.FOLLOW)
