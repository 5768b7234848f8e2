"""Where a job's output and savepoints stand, for the asset watchers
(`triggers.assets`): the position of its commit head, and the savepoints completed since
a cursor, read so that a poll costs one GET (commits) or one LIST plus the directories
not seen yet (savepoints). The cursor is small JSON the watcher keeps across triggerer
restarts. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.commit_head import read_commit_head

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["MAX_KNOWN_SAVEPOINTS", "commit_position", "savepoint_position"]

#: savepoint names a savepoint watcher's cursor keeps (the newest; retention keeps fewer);
#: the older ones are summed up by a checkpoint id (`_trim`)
MAX_KNOWN_SAVEPOINTS = 500


def commit_position(catalog: Catalog) -> dict[str, Any]:
    """The job's commit head (``committed.json``: moved only after a sink confirmed a
    commit) as a cursor: ``seq``, ``txn_id``, ``batch``, ``generation``, ``sink``,
    ``sink_version``, ``committed_at``; ``seq`` 0 and no transaction before any commit.

    :raises SparkpointError: the record cannot be read.
    """
    head = read_commit_head(catalog)
    if head is None:
        return {"seq": 0, "txn_id": None, "batch": None}
    return {"seq": head.seq, "txn_id": head.txn_id, "batch": head.batch, "generation": head.generation,
            "sink": head.sink_id, "sink_version": head.sink_version, "committed_at": head.committed_at}


def savepoint_position(catalog: Catalog, cursor: dict[str, Any] | None) -> dict[str, Any]:
    """The savepoints of the job after `cursor` (None: the first look): ``known`` (the
    names the next cursor keeps), ``floor`` (the checkpoint at or below which every
    savepoint was seen), ``fresh`` (the names completed since `cursor`, oldest first) and
    their ``details`` (URI, generation, batch, checkpoint id, creation time); `cursor`
    itself when nothing new completed.

    One listing of ``savepoints/``; then only the directories not seen yet are read (one
    listing and the ``_metadata`` each): a directory still being copied, or left by a
    copy that died, is read again at each poll, never the savepoints already seen.

    :raises SparkpointError: the store cannot be read.
    """
    known = list((cursor or {}).get("known", ()))
    floor = (cursor or {}).get("floor")
    if cursor is not None and "floor" not in cursor and len(known) >= MAX_KNOWN_SAVEPOINTS:
        # The previous release's cursor: it kept the newest names and forgot the rest.
        # Below the oldest checkpoint it names, those are seen; at it, one may be
        # reported again (at least once: consumers dedupe by URI), none is missed.
        floor = min((c for c in map(layout.savepoint_checkpoint, known) if c is not None), default=0) - 1
    seen = set(known)
    listed = catalog.store.list_dirs(layout.SAVEPOINTS)
    unseen = [name for name in listed if name not in seen and not _below(name, floor)]
    # Each kept as its summary once read: one savepoint's file list in memory at a time.
    entries = [e.slim() for e in map(catalog.savepoint_entry, unseen) if e is not None and e.valid]
    if cursor is not None and not entries:
        return cursor  # nothing new completed: no metadata of a seen savepoint read
    entries.sort(key=lambda e: (e.created_at, e.id))
    fresh = [e.key.rsplit("/", 1)[-1] for e in entries]
    present = set(listed)
    kept, floor = _trim([n for n in known if n in present] + fresh, floor)
    details = {e.key.rsplit("/", 1)[-1]: {"savepoint": e.uri, "generation": e.summary.generation,
                                          "batch": e.summary.batch_id, "checkpoint_id": e.id,
                                          "created_at": e.summary.created_at}
               for e in entries if e.summary is not None}
    return {"known": kept, "floor": floor, "fresh": fresh, "details": details}


def _below(name: str, floor: int | None) -> bool:
    """Whether savepoint directory `name` is of a checkpoint at or before `floor` (the
    cursor's record of the savepoints it stopped naming: seen, see `_trim`)."""
    checkpoint = layout.savepoint_checkpoint(name)
    return floor is not None and checkpoint is not None and checkpoint <= floor


def _trim(names: list[str], floor: int | None) -> tuple[list[str], int | None]:
    """`names` (oldest first) cut to `MAX_KNOWN_SAVEPOINTS`, and the new floor: the
    savepoints of the oldest checkpoints are dropped a whole checkpoint at a time, and the
    floor says they were seen. The newest checkpoint's are never dropped: an idle job (no
    new batch) takes every savepoint of one checkpoint, and the cursor names them all
    until it checkpoints again. A savepoint is taken of the newest completed checkpoint,
    whose id is above those of savepoints seen `MAX_KNOWN_SAVEPOINTS` savepoints ago; only
    one taken after the newest checkpoints were disposed of by hand could fall under the
    floor and go unreported."""
    by_checkpoint: dict[int, list[str]] = {}
    for name in names:
        by_checkpoint.setdefault(layout.savepoint_checkpoint(name) or 0, []).append(name)
    order = sorted(by_checkpoint)
    count = len(names)
    dropped: set[str] = set()
    for checkpoint in order[:-1]:
        if count <= MAX_KNOWN_SAVEPOINTS:
            break
        dropped.update(by_checkpoint[checkpoint])
        count -= len(by_checkpoint[checkpoint])
        floor = checkpoint if floor is None else max(floor, checkpoint)
    return [n for n in names if n not in dropped], floor
