"""Rebuilding Spark's checkpoint location from a snapshot (`materialize`): for a restore
into a fresh live location (`restore.fill_live`), and for inspection and verification
in a scratch directory.

Every file is hard-linked from the previous live location when it is the very file the
snapshot recorded (same size and mtime: Spark never rewrites a file in place), else
downloaded from the store; a few small files that embed the old location's absolute path
are rewritten. Both locations are shared places (the work directory's writers): every
path in them is reached from directory descriptors without following a link
(`storage.localfs`), so a link planted anywhere in the previous location is never
hard-linked in, and the new location's directories are real ones.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import stat
from collections.abc import Sequence

from airflow_sparkpoint.checkpoints import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef
from airflow_sparkpoint.checkpoints.transfer import THREADS, transfer_all
from airflow_sparkpoint.exceptions import InvalidPath, RestoreError
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.prestore import IndexEntry
from airflow_sparkpoint.storage.localfs import Dir

__all__ = ["materialize"]

log = logging.getLogger(__name__)

# Small text files of Spark's checkpoint that may embed the absolute checkpoint path
# (transformWithState's operator metadata records its state schema file paths).
_REWRITE_MAX_BYTES = 4 * 1024 * 1024
#: the most files of one directory placed with one opening of it (more directories than
#: transfer threads keep the downloads parallel)
_GROUP_MAX = 32


def materialize(
    handle: SnapshotHandle,
    live_path: str,
    *,
    stored: bool = True,
    link_from: str | None = None,
    counts: dict[str, int] | None = None,
    only_read: bool = False,
    repair: bool = True,
    live: Dir | None = None,
) -> dict[str, IndexEntry]:
    """Rebuild Spark's checkpoint location at `live_path` from a snapshot (which is never
    modified: NO_CLAIM). Returns the file index that lets the next checkpoint reuse the
    stored files (`stored`: the snapshot's files are this job's shared files) or at least
    their known checksums (they live in another store and must be copied once).

    Files of `link_from` (a previous live location) with the size and mtime the snapshot
    recorded are hard-linked instead of downloaded when on the same filesystem; `counts`
    receives how many were ``linked``, ``downloaded`` and ``skipped``. With `only_read`,
    the RocksDB state versions a restart never reads (`livedir.unread_at_restart`: those
    before each store's newest snapshot, or with `repair` before the one Spark falls back
    to; up to ~100 versions of changelogs in a long-running job) stay in the snapshot: a
    restore reads what Spark loads.

    `live` is `live_path` already open (the chosen location's `LiveLock.dir`). Every path
    in both locations is reached without following a link (`storage.localfs`): a link in
    `link_from` is never hard-linked in, whatever it points to.
    """
    with contextlib.ExitStack() as stack:
        target = (live if live is not None
                  else stack.enter_context(livedir.open_location(live_path, create=True)))
        previous = None
        if link_from:
            try:
                previous = stack.enter_context(livedir.open_location(link_from))
            except (OSError, InvalidPath) as exc:
                log.warning("not linking files from %s: %s", link_from, exc)
        return _materialize(handle, live_path, target, previous, stored=stored, counts=counts,
                            only_read=only_read, repair=repair)


def _groups(files: Sequence[FileRef]) -> list[tuple[str, list[FileRef]]]:
    """`files` by directory, in runs of at most `_GROUP_MAX` (fewer when there are few
    files: every transfer thread gets work)."""
    size = max(1, min(_GROUP_MAX, math.ceil(len(files) / (THREADS * 4))))
    by_directory: dict[str, list[FileRef]] = {}
    for ref in files:
        by_directory.setdefault(ref.path.rpartition("/")[0], []).append(ref)
    return [(directory, refs[i:i + size]) for directory, refs in by_directory.items()
            for i in range(0, len(refs), size)]


def _materialize(handle: SnapshotHandle, live_path: str, live: Dir, previous: Dir | None, *, stored: bool,
                 counts: dict[str, int] | None, only_read: bool, repair: bool) -> dict[str, IndexEntry]:
    livedir.clear(live)
    meta = handle.metadata
    unread = livedir.unread_at_restart((ref.path for ref in meta.files), meta.batch_id,
                                       repair=repair) if only_read else set()
    files = [ref for ref in meta.files if ref.path not in unread]
    old_roots = _path_forms(meta.live_root) if meta.live_root else []
    new_root = os.path.abspath(live_path)

    def place(group: tuple[str, list[FileRef]]) -> list[tuple[FileRef, bool, IndexEntry | None]]:
        """Link or download the files of one directory (in a transfer thread), opening it
        once in each location; (ref, linked, its index entry) each."""
        directory, refs = group
        with contextlib.ExitStack() as stack:
            target = stack.enter_context(live.sub(directory, create=True))  # a link on the way is refused
            source = None
            if previous is not None:
                with contextlib.suppress(OSError, InvalidPath):  # not there (or a link): nothing to link
                    source = stack.enter_context(previous.sub(directory))
            return [(ref, *_place(handle, ref, target, source, live_path, old_roots, new_root, stored))
                    for ref in refs]

    # A few directories at a time (`transfer`): each download is a round trip to the store.
    # A failed download fails the restore before Spark sees the location. Spark's commit
    # log goes last: a location a restore left half-filled (a crash, a failed download)
    # then shows no commit of the snapshot's batch, so no later start resumes it in place.
    commits = [ref for ref in files if ref.path.startswith("commits/")]
    rest = [ref for ref in files if not ref.path.startswith("commits/")]
    placed = [item for batch in (rest, commits) if batch
              for items in transfer_all(place, _groups(batch)) for item in items]
    index = {ref.path: entry for ref, _l, entry in placed if entry is not None}
    linked = sum(1 for _r, was_linked, _e in placed if was_linked)
    if counts is not None:
        counts.update(linked=linked, downloaded=len(files) - linked, skipped=len(unread))
    log.info("materialized %d files (%d bytes) of %s into %s (%d hard-linked from %s, "
             "%d downloaded; %d older "
             "state versions a restart does not read, %d bytes, left in the snapshot)",
             len(files), sum(ref.size for ref in files), handle.uri, live_path, linked,
             previous.path if previous is not None else None, len(files) - linked,
             len(unread), sum(ref.size for ref in meta.files if ref.path in unread))
    return index


def _place(handle: SnapshotHandle, ref: FileRef, target: Dir, source: Dir | None, live_path: str,
           old_roots: list[bytes], new_root: str, stored: bool) -> tuple[bool, IndexEntry | None]:
    """Link or download one file into `target` (its directory); (linked, its index entry)."""
    name = ref.path.rpartition("/")[2]
    was_linked = source is not None and _link(source, target, name, ref.size, ref.mtime_ns)
    if not was_linked:
        handle.files_store.download_file(ref.key, os.path.join(live_path, *ref.path.split("/")))
    if old_roots and ref.size <= _REWRITE_MAX_BYTES and _rewrite_paths(target, name, old_roots, new_root):
        return was_linked, None  # a new file (a link is never modified): the next checkpoint stores it
    st = target.stat(name)
    if st is None or not stat.S_ISREG(st.st_mode):
        raise RestoreError(f"{live_path}/{ref.path} is not the file just placed there (it was replaced)")
    return was_linked, IndexEntry(st.st_size, st.st_mtime_ns, ref, stored=stored)


def _link(previous: Dir, live: Dir, rel: str, size: int, mtime_ns: int) -> bool:
    """Hard-link `rel` of the previous live location to `rel` of the new one if it is the
    file the snapshot recorded (same size and mtime: Spark never rewrites a file in place);
    False when it is not or cannot be linked. Neither end is reached through a link
    (`storage.localfs`): a link anywhere on the way (to anywhere) is never linked in."""
    if mtime_ns <= 0:
        return False
    linked = previous.link_to(rel, live, rel)  # not a regular file, gone, another filesystem (EXDEV): None
    if linked is None:
        return False
    if linked.st_size == size and linked.st_mtime_ns == mtime_ns:
        return True
    live.unlink(rel)  # another file than the snapshot's: downloaded instead
    return False


def _path_forms(root: str) -> list[bytes]:
    root = root.rstrip("/")
    return sorted({f"file:{root}".encode(), f"file://{root}".encode(), root.encode()}, key=len, reverse=True)


def _rewrite_paths(live: Dir, rel: str, old_roots: list[bytes], new_root: str) -> bool:
    """Rewrite the absolute paths of the old live location in the small file `rel` of
    `live` (a new file renamed over it: a hard-linked original is never changed); whether
    it held any.

    :raises ObjectTooLarge: it is larger than the small files this applies to.
    """
    data = live.read(rel, _REWRITE_MAX_BYTES)
    if not any(old in data for old in old_roots):
        return False
    # One pass over all forms, longest first, so a replacement is never replaced again.
    pattern = re.compile(b"|".join(re.escape(old) for old in old_roots))

    def swap(match: re.Match[bytes]) -> bytes:
        old = match.group(0)
        scheme = b"file://" if old.startswith(b"file://") else b"file:" if old.startswith(b"file:") else b""
        return scheme + new_root.encode()

    live.write(rel, pattern.sub(swap, data), fsync=False)
    return True
