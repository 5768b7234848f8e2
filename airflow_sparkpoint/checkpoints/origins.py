"""The lineage origin records of a job (``lineage/<generation>.json``) and the pins they
own (``pins/<generation>/``): the one writer and reader of `lineage.Origin` records;
`Catalog` exposes them as methods. The rules over them are `checkpoints.lineage`'s."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from functools import partial

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.lineage import Origin
from airflow_sparkpoint.exceptions import CorruptRecord, InvalidPath, RestoreError
from airflow_sparkpoint.storage import Storage

__all__ = ["delete_origins", "has_origin", "read_origins", "write_origin"]

log = logging.getLogger(__name__)


def write_origin(store: Storage, origin: Origin) -> None:
    """Record what generation `origin.generation` started from (once: atomic create).

    :raises ObjectExists: that generation already recorded its origin.
    """
    store.put_if_absent(layout.lineage_key(origin.generation), json.dumps(origin.to_json(), sort_keys=True).encode())


def has_origin(store: Storage, generation: int) -> bool:
    """Whether `generation` recorded its origin (it is past its start's planning), or the
    store predates lineages (no origin at all: nothing to wait for)."""
    if store.exists(layout.lineage_key(generation)):
        return True
    return not any(layout.LINEAGE_RE.match(info.key.rsplit("/", 1)[-1]) for info in store.list(layout.LINEAGE))


def read_origins(store: Storage, uri: str, known: dict[str, Origin] | None = None) -> list[Origin]:
    """Every origin record, by generation (unreadable ones are skipped with a warning).

    `known` (key -> origin, updated here): records read before, not read again (an origin
    is created once and never rewritten); the listing decides which exist."""
    result = []
    listed = set()
    for info in store.list(layout.LINEAGE):
        if not layout.LINEAGE_RE.match(info.key.rsplit("/", 1)[-1]):
            continue
        listed.add(info.key)
        if known is not None and info.key in known:
            result.append(known[info.key])
            continue
        where = f"{uri}/{info.key}"
        try:
            origin = bounded.read_record(store, info.key, partial(Origin.from_json, where=where),
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


def delete_origins(store: Storage, origins: Iterable[Origin], kept: Iterable[Origin],
                   key_of: Callable[[str], str]) -> None:
    """Delete origin records, then the pin each one owns unless an origin in `kept` (the
    origins that stay) restarts from it or carries it (a rollback's origin is the
    rolled-back generation's, pin included). `key_of` maps a pin's URI to its key in the
    job's root (`Catalog.key_of`); a pin outside ``pins/`` is never deleted."""
    origins = list(origins)
    store.delete(layout.lineage_key(o.generation) for o in origins)
    still = {uri.rstrip("/") for o in kept for uri in (o.pin, o.uri) if uri}
    for pin in {o.pin.rstrip("/") for o in origins if o.pin is not None} - still:
        try:
            key = key_of(pin)
        except (RestoreError, InvalidPath):
            continue  # not a pin of this job (a forged record): never deleted
        if layout.parse_pin_dir(key) is not None:
            store.delete_prefix(key)
