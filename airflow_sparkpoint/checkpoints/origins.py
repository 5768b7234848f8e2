"""The lineage origin records of a job (``lineage/<generation>.json``) and the pins they
own (``pins/<generation>/``): the one writer and reader of `lineage.Origin` records
(`OriginStore`); `Catalog` composes it. The rules over them are `checkpoints.lineage`'s."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from functools import partial

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.lineage import Origin
from airflow_sparkpoint.exceptions import CorruptRecord, InvalidPath, RestoreError
from airflow_sparkpoint.storage import Storage

__all__ = ["OriginStore"]

log = logging.getLogger(__name__)


class OriginStore:
    """The origin records of one job (`store`: its keys, at `uri`) and the pins they own;
    `key_of` maps a pin's URI to its key in the job's root (`SnapshotStore.key_of`)."""

    def __init__(self, store: Storage, uri: str, key_of: Callable[[str], str]) -> None:
        self.store = store
        self.uri = uri
        self._key_of = key_of

    def write(self, origin: Origin) -> None:
        """Record what generation `origin.generation` started from (once: atomic create).

        :raises ObjectExists: that generation already recorded its origin.
        """
        self.store.put_if_absent(layout.lineage_key(origin.generation),
                                 json.dumps(origin.to_json(), sort_keys=True).encode())

    def has(self, generation: int) -> bool:
        """Whether `generation` recorded its origin (it is past its start's planning), or the
        store predates lineages (no origin at all: nothing to wait for)."""
        if self.store.exists(layout.lineage_key(generation)):
            return True
        return not any(layout.LINEAGE_RE.match(info.key.rsplit("/", 1)[-1])
                       for info in self.store.list(layout.LINEAGE))

    def read(self, known: dict[str, Origin] | None = None) -> list[Origin]:
        """Every origin record, by generation (unreadable ones are skipped with a warning).

        `known` (key -> origin, updated here): records read before, not read again (an
        origin is created once and never rewritten); the listing decides which exist."""
        result = []
        listed = set()
        for info in self.store.list(layout.LINEAGE):
            if not layout.LINEAGE_RE.match(info.key.rsplit("/", 1)[-1]):
                continue
            listed.add(info.key)
            if known is not None and info.key in known:
                result.append(known[info.key])
                continue
            where = f"{self.uri}/{info.key}"
            try:
                origin = bounded.read_record(self.store, info.key, partial(Origin.from_json, where=where),
                                             limits=layout.limits_of(info.key), where=where)
            except CorruptRecord as exc:
                log.warning("skipping unreadable origin record %s", exc)
                continue
            if origin is None:
                continue  # pruned meanwhile
            result.append(origin)
            if known is not None:
                known[info.key] = origin
        if known is not None:
            for gone in set(known) - listed:
                del known[gone]
        return sorted(result, key=lambda o: o.generation)

    def delete(self, origins: Iterable[Origin], kept: Iterable[Origin] = ()) -> None:
        """Delete origin records, then the pin each one owns unless an origin in `kept` (the
        origins that stay) restarts from it or carries it (a rollback's origin is the
        rolled-back generation's, pin included). A pin outside ``pins/`` is never deleted."""
        origins = list(origins)
        self.store.delete(layout.lineage_key(o.generation) for o in origins)
        still = {uri.rstrip("/") for o in kept for uri in (o.pin, o.uri) if uri}
        for pin in {o.pin.rstrip("/") for o in origins if o.pin is not None} - still:
            try:
                key = self._key_of(pin)
            except (RestoreError, InvalidPath):
                continue  # not a pin of this job (a forged record): never deleted
            if layout.parse_pin_dir(key) is not None:
                self.store.delete_prefix(key)
