"""Which generation produced each batch of a snapshot's lineage (invariant 12).

A snapshot at batch N carries the batches 0..N of its own history as ranges
``(first, last, generation)``: batches ``first..last`` were staged by that generation,
so their commits are the transactions ``<job>-b<i>-g<generation>``. A run continues the
ranges of the snapshot it restored and adds its own batches; a replayed batch keeps the
generation whose commit the sink holds. With them a restore can tell whether a sink
holds exactly what the snapshot's lineage committed (`runtime.sink_lineage`), and a
rewind can find that lineage's own commit. Only the newest `MAX_RANGES` ranges are kept:
a job restarted every few minutes for a year must not grow every ``_metadata``; a check
that needs an older batch's owner finds none and says so.

Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.exceptions import CorruptMetadata

__all__ = ["MAX_RANGES", "BatchOwners"]

#: ranges kept (one per generation that staged batches of the lineage, newest last)
MAX_RANGES = 64


@dataclass(frozen=True)
class BatchOwners:
    """Ascending, non-overlapping ``(first, last, generation)`` ranges (see the module
    docstring)."""

    ranges: tuple[tuple[int, int, int], ...] = ()

    def of(self, batch: int) -> int | None:
        """The generation that staged `batch` in this lineage, or None when unknown (not
        reached yet, older than the ranges kept, or a snapshot of an earlier release)."""
        for first, last, generation in reversed(self.ranges):
            if first <= batch <= last:
                return generation
            if last < batch:
                return None
        return None

    @property
    def last(self) -> int | None:
        """The newest batch with an owner, or None."""
        return self.ranges[-1][1] if self.ranges else None

    def upto(self, batch: int) -> BatchOwners:
        """The ranges of batches up to `batch` (a restore of a snapshot at `batch`)."""
        kept = [(first, min(last, batch), g) for first, last, g in self.ranges if first <= batch]
        return BatchOwners(tuple(kept))

    def with_batch(self, batch: int, generation: int) -> BatchOwners:
        """These ranges, with `batch` staged by `generation` (later batches dropped: a batch
        runs again only after a restart at or before it)."""
        if self.of(batch) == generation and self.last == batch:
            return self
        ranges = list(self.upto(batch - 1).ranges)
        if ranges and ranges[-1][2] == generation and ranges[-1][1] == batch - 1:
            ranges[-1] = (ranges[-1][0], batch, generation)
        else:
            ranges.append((batch, batch, generation))
        return BatchOwners(tuple(ranges[-MAX_RANGES:]))

    def with_batches(self, owners: Iterable[tuple[int, int]]) -> BatchOwners:
        """These ranges with each ``(batch, generation)`` added in order."""
        result = self
        for batch, generation in owners:
            result = result.with_batch(batch, generation)
        return result

    def to_json(self) -> list[list[int]]:
        return [[first, last, generation] for first, last, generation in self.ranges]

    @classmethod
    def from_json(cls, data: Any, *, where: str = "batch_owners") -> BatchOwners:
        """:raises CorruptMetadata: not a list of ascending ``[first, last, generation]``."""
        if data is None:
            return cls()
        try:
            ranges = tuple(_range(item) for item in data)
        except (TypeError, ValueError) as exc:
            raise CorruptMetadata(f"{where}: malformed batch owners ({exc})") from None
        previous = -1
        for first, last, _g in ranges:
            if first <= previous:
                raise CorruptMetadata(f"{where}: batch owners are not ascending at batch {first}")
            previous = last
        return cls(ranges[-MAX_RANGES:])


def _range(item: Sequence[Any]) -> tuple[int, int, int]:
    if isinstance(item, (str, bytes)) or len(item) != 3 or any(isinstance(v, bool) for v in item):
        raise ValueError(f"{item!r} is not [first, last, generation]")
    first, last, generation = (int(v) for v in item)
    if not 0 <= first <= last or generation < 1:
        raise ValueError(f"{item!r} is not [first, last, generation] with 0 <= first "
                         "<= last, generation >= 1")
    return first, last, generation
