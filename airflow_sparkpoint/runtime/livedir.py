"""Spark's live checkpoint location: what a restart after batch N needs, and who owns it.

Spark writes every file of its checkpoint location atomically (temp file + rename) and
never changes it afterwards, except when a batch is re-executed; so a file is identified
by (path, size, mtime) and copied to Sparkpoint storage once (and may be hard-linked into
another location: a rename there never touches the linked inode).

**Ownership** (invariant 8: a live directory is never shared by two generations that may
both be running). The run that uses a location holds an exclusive ``flock`` on
``<location>/.sparkpoint-lock`` for its whole life (the kernel drops it when the process
dies, even by SIGKILL) and records itself in ``<location>/.sparkpoint-owner.json``
(generation, host, pids of the Python driver and its JVM with their start times, so a
reused pid is not mistaken for the owner). Another run may resume in that location only
when it gets the lock and the previous owner is proven gone: its generation ended (a
terminal status record written by that generation), or its processes on this host are gone.

The work directory is a shared place: every path in it is reached through
`storage.localfs`, a live location's own name included (`open_location`): a ``g<N>``
planted as a link is never locked, written or cleared through, a link inside a location
is never followed, a Spark log file is read bounded (`layout.SNAPSHOT_LOG_MAX_BYTES`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import socket
import stat
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import bounded, layout, spark_layout
from airflow_sparkpoint.checkpoints.status import JobStatus
from airflow_sparkpoint.exceptions import InvalidPath, StorageError
from airflow_sparkpoint.runtime.config import local_path_of, require_local
from airflow_sparkpoint.storage.localfs import Dir, open_path

__all__ = ["local_path_of", "require_local"]  # the live-location rule lives in runtime.config

log = logging.getLogger(__name__)

LOCK_NAME = ".sparkpoint-lock"
#: what a live location being deleted is renamed to first (`remove_unowned`)
TRASH_PREFIX = ".removing-"
OWNER_NAME = ".sparkpoint-owner.json"
#: an owner record is a few hundred bytes
_OWNER_MAX_BYTES = 64 * 1024
#: the owner record's bounds (`checkpoints.bounded`): it lies in a shared place
_OWNER_LIMITS = bounded.Limits(max_bytes=_OWNER_MAX_BYTES, max_cost=4 * 1024 * 1024)
TERMINAL_STATES = ("finished", "stopped", "failed")


@dataclass(frozen=True)
class LiveFile:
    path: str  # relative, '/'-separated
    abspath: str
    size: int
    mtime_ns: int


def open_location(path: str, *, create: bool = False) -> Dir:
    """The live location (or a directory of the work root) at `path`, open: its own name
    is not followed (a ``g<N>`` planted as a link is refused), nor anything below it.

    :raises FileNotFoundError: it does not exist (and not `create`).
    :raises InvalidPath: it is a link.
    """
    path = os.path.abspath(path)
    return Dir.open(path, create=create, anchor=os.path.dirname(path))


def file_sha256(path: str) -> str:
    """The sha256 of the regular file at `path` (read in 8 MiB chunks), as hex.

    :raises FileNotFoundError: it is missing.
    :raises InvalidPath: it is a link or not a regular file (never read).
    """
    digest = hashlib.sha256()
    handle, _st = open_path(path)
    with handle:
        while chunk := handle.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _skipped(name: str, is_dir: bool) -> bool:
    """Hidden directories, Hadoop checksums and temp files are not part of a checkpoint."""
    return name.startswith(".") or (not is_dir and (name.endswith((".crc", ".tmp"))
                                                    or "sparkpoint-tmp" in name))


def walk(root: str, rel: str = "") -> Iterator[LiveFile]:
    """Every regular file under the directory `rel` of the live location `root` (paths
    relative to `rel`), skipping Hadoop checksums and temp files; links are neither
    listed nor followed. Nothing when it is missing or behind a link."""
    try:
        location = open_location(root)
    except (FileNotFoundError, NotADirectoryError, InvalidPath):
        return
    base = os.path.join(root, *rel.split("/")) if rel else root
    with location:
        try:
            for path, st in location.walk_files(rel, skip=_skipped):
                yield LiveFile(path, os.path.join(base, *path.split("/")), st.st_size, st.st_mtime_ns)
        except InvalidPath as exc:
            log.warning("not reading %s: %s", base, exc)


def read_log_file(root: str, rel: str) -> str | None:
    """The text of the Spark log file `rel` of the live location `root` (``offsets/N``),
    or None when it is missing.

    :raises ObjectTooLarge: it is over `layout.SNAPSHOT_LOG_MAX_BYTES` (corrupt, never
        read whole); the message names it.
    :raises InvalidPath: it (or a directory on its way) is a link or not a regular file.
    :raises UnicodeDecodeError: it is not UTF-8.
    """
    try:
        location = open_location(root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with location:
        return location.read_text(rel, layout.SNAPSHOT_LOG_MAX_BYTES)


def needed_for_restart(path: str, batch_id: int, source_ends: Mapping[str, int] | None = None) -> bool:
    """Whether the file at `path` belongs to the restart point after batch `batch_id`.

    Logs (offsets, commits, operator metadata) up to `batch_id`; a file source's log up to
    the entry ``offsets/<batch_id>`` names for it (`source_ends`, by source index, from
    `source_log_ends`), at least up to `batch_id`; state store versions up to
    ``batch_id + 1`` (the state after batch N is version N+1); everything version-less
    (SST files, schemas, the query metadata) always.
    """
    parts = path.split("/")
    name = parts[-1]
    if parts[0] in (spark_layout.OFFSETS, spark_layout.COMMITS) and len(parts) == 2:
        entry = spark_layout.log_entry(name)
        return entry is not None and entry[0] <= batch_id
    if parts[0] == spark_layout.SOURCES:
        entry = spark_layout.log_entry(name)
        end = max(batch_id, (source_ends or {}).get(parts[1], -1)) if len(parts) == 3 else batch_id
        return not entry or entry[0] <= end
    if parts[0] == spark_layout.STATE:
        metadata = spark_layout.operator_metadata(path)
        if metadata is not None and metadata[1] is not None:
            return metadata[1] <= batch_id
        version = spark_layout.state_version(name)
        if version:
            return version[0] <= batch_id + 1
        return True
    return True


def source_log_ends(root: str, batch_id: int) -> dict[str, int]:
    """The file-source log entry each source's offset in ``offsets/<batch_id>`` names, by
    source index. It is `batch_id` itself unless Spark folded two source-log batches into
    one micro-batch: a driver killed after it wrote ``sources/<i>/<k>`` but before
    ``offsets/<k>`` leaves an entry that the restart's next batch covers together with the
    new one (``offsets/2`` = ``{"logOffset":3}``); a checkpoint without entry 3 would let a
    restore assign new files to it and skip them."""
    try:
        text = read_log_file(root, spark_layout.offsets_entry(batch_id))
    except (OSError, UnicodeDecodeError, StorageError) as exc:
        log.warning("cannot read offsets/%d in %s: %s", batch_id, root, exc)
        return {}
    lines = source_offsets(text or "")
    offsets = {str(index): file_source_log_offset(line) for index, line in enumerate(lines)}
    return {index: end for index, end in offsets.items() if end is not None}


def source_offsets(offset_log_entry: str) -> list[str]:
    """The per-source lines of an ``offsets/N`` entry (after the version and metadata)."""
    lines = offset_log_entry.split("\n")
    return [line for line in lines[2:] if line.strip()]


def file_source_log_offset(line: str) -> int | None:
    """The log offset of a file source's offset line, or None for any other source."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict) and set(value) == {"logOffset"} and isinstance(value["logOffset"], int):
        return value["logOffset"]
    return None


def committed_batches(root: str) -> list[int]:
    """The batch ids with a ``commits/<id>`` file in a live location, in order (none
    when ``commits`` or the location is a link)."""
    try:
        with open_location(root) as location:
            names = location.names(spark_layout.COMMITS)
    except (FileNotFoundError, NotADirectoryError, InvalidPath):
        return []
    return sorted(int(n) for n in names if n.isdigit())


def is_committed(root: str, batch_id: int) -> bool:
    """Whether Spark committed batch `batch_id` in a live location (its ``commits/<id>``
    file, which Spark writes atomically)."""
    try:
        with open_location(root) as location:
            return location.is_file(spark_layout.commits_entry(batch_id))
    except (FileNotFoundError, NotADirectoryError, InvalidPath):
        return False


def last_commit(root: str) -> int | None:
    """The highest batch id with a ``commits/<id>`` file in a live location, or None."""
    ids = committed_batches(root)
    return ids[-1] if ids else None


@dataclass(frozen=True)
class StoreVersions:
    """The versioned files of one state store instance (``state/<op>/<partition>[/<store>]``)."""

    dir: str  # relative, '/'-separated
    latest: int  # newest version (changelog, delta or snapshot)
    snapshot: int  # newest snapshot version (.zip / .snapshot), 0 when none
    replay_bytes: int  # the changelogs a load of `latest` replays after that snapshot


def state_stores(root: str, batch_id: int, dirs: Iterable[str] | None = None) -> list[StoreVersions]:
    """Every state store instance of a live location (or those in `dirs`, relative), as of
    the restart point after `batch_id`."""
    files = ((f"{base}/{live.path}", live.size)
             for base in ([spark_layout.STATE] if dirs is None else dirs)
             for live in walk(root, base))
    return _stores(files, max_version=batch_id + 1)


def _versioned(paths: Iterable[str]) -> dict[str, list[tuple[int, str, str]]]:
    """The versioned state files among `paths` (relative), by store directory:
    ``(version, kind, path)`` each."""
    found: dict[str, list[tuple[int, str, str]]] = {}
    for path in paths:
        directory, _, name = path.rpartition("/")
        version = spark_layout.state_version(name)
        if path.startswith(f"{spark_layout.STATE}/") and version:
            found.setdefault(directory, []).append((version[0], version[1], path))
    return found


def _stores(files: Iterable[tuple[str, int]], max_version: int | None = None) -> list[StoreVersions]:
    """The state stores among `files` ((relative path, size)), versions up to `max_version`."""
    sizes = dict(files)
    stores = []
    for directory, found in sorted(_versioned(sizes).items()):
        versions = [(v, kind, sizes[path]) for v, kind, path in found
                    if max_version is None or v <= max_version]
        if not versions:
            continue
        snapshot = max((v for v, kind, _ in versions if kind in spark_layout.SNAPSHOT_KINDS), default=0)
        stores.append(StoreVersions(
            dir=directory, latest=max(v for v, _, _ in versions), snapshot=snapshot,
            replay_bytes=sum(size for v, kind, size in versions
                             if kind in ("changelog", "delta") and v > snapshot),
        ))
    return stores


def newest_snapshots(paths: Iterable[str]) -> dict[str, int]:
    """The newest snapshot version per state store directory among `paths` (relative)."""
    return {store.dir: store.snapshot for store in _stores((path, 0) for path in paths) if store.snapshot}


def unread_at_restart(paths: Iterable[str], batch_id: int, *, repair: bool = False) -> set[str]:
    """The RocksDB state files among `paths` (relative: a snapshot of batch `batch_id`) that
    a restart from it never reads: in each store directory, every version older than its
    newest snapshot (``.zip``) at or below the version the restart loads (`batch_id` + 1).
    Spark loads that snapshot and replays only the changelogs after it, and its maintenance
    deletes the older versions in time anyway.

    With `repair` (`spark_support.snapshot_repair`: Spark falls back to an older snapshot
    when the newest fails to load, and replays more changelogs), a store that has
    changelogs keeps everything from its second-newest snapshot, or everything when it has
    only one. Kept whole: stores with unique-id names (checkpoint format v2, whose commit
    log picks the files) and the HDFS provider's (its cleanup requires the file of the
    oldest version it retains)."""
    restart = batch_id + 1
    unread: set[str] = set()
    for versions in _versioned(paths).values():
        if any(kind not in spark_layout.ROCKSDB_KINDS or spark_layout.has_unique_id(path.rpartition("/")[2])
               for _, kind, path in versions):
            continue
        snapshots = sorted({v for v, kind, _ in versions if kind == "zip" and v <= restart}, reverse=True)
        if repair and any(kind == "changelog" for _, kind, _ in versions):
            snapshots = snapshots[1:]  # the snapshot Spark falls back to when the newest fails to load
        cut = snapshots[0] if snapshots else 0
        unread.update(path for v, _, path in versions if v < cut)
    return unread


def replay_bytes(files: Iterable[tuple[str, int]]) -> int:
    """The changelog (and HDFS delta) bytes that loading the state in `files` ((relative
    path, size) of a checkpoint) replays: per store, those newer than its newest snapshot."""
    return sum(store.replay_bytes for store in _stores(files))


def pending_snapshots(root: str, batch_id: int, min_deltas: int,
                      dirs: Iterable[str] | None = None) -> list[StoreVersions]:
    """The RocksDB state stores for which Spark has created a snapshot that its maintenance
    has not uploaded yet: Spark creates one at a commit that is `min_deltas` (its
    ``minDeltasForSnapshot``) or more versions past the last, and uploads it later, in the
    background; until then a load replays every changelog since the previous one."""
    return [s for s in state_stores(root, batch_id, dirs) if s.latest - s.snapshot >= min_deltas]


# ---------------------------------------------------------------------------- ownership


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read().decode(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc), or None."""
    fields = proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def process_alive(pid: int, start: str | None) -> bool:
    """Whether process `pid` still runs and is the one that started at `start` (when known).

    Without /proc or a recorded start time a live pid counts as alive (it may be reused,
    but "not proven gone" is the safe answer)."""
    if pid <= 0:
        return False
    fields = proc_stat(pid)
    if fields and fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped (an init that reaps late): it runs nothing
    current = process_start(pid)
    if current is not None:
        return start is None or current == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LiveLock:
    """An exclusive lock on a live location, held until `release` (or the process ends);
    `dir` is the location, open (`open_location`) while the lock is held."""

    def __init__(self, path: str, fd: int, location: Dir | None = None) -> None:
        self.path = path
        self._fd: int | None = fd
        self.dir = location

    @property
    def fd(self) -> int | None:
        """The lock file's descriptor while held (a process it is handed to keeps the lock)."""
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self.dir is not None:
            self.dir.close()
            self.dir = None


def try_lock(location: str) -> LiveLock | None:
    """Take the exclusive lock of `location` (created if needed) without waiting, or None
    when another run holds it.

    :raises OSError: `location` (or its lock file) is a link (``ELOOP``: never locked
        through), or cannot be created.
    """
    import fcntl

    try:
        directory = open_location(location, create=True)
    except InvalidPath as exc:
        raise OSError(errno.ELOOP, str(exc), location) from None
    try:
        fd = directory.open_fd(LOCK_NAME, os.O_RDWR | os.O_CREAT)
    except InvalidPath as exc:
        directory.close()
        raise OSError(errno.ELOOP, str(exc), location) from None
    except BaseException:
        directory.close()
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        directory.close()
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return LiveLock(location, fd, directory)


def unlink_planted(location: str) -> None:
    """Remove a link at `location` (where a new live location goes: Sparkpoint makes
    directories there, never links, so one was planted), with a warning: the location is
    then made anew, nothing is locked, written or cleared through the link."""
    parent, name = os.path.split(os.path.abspath(location))
    try:
        with Dir.open(parent) as directory:
            st = directory.stat(name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                log.warning("removing the link %s planted where a live location goes; a "
                            "new directory is made there",
                            location)
                directory.unlink(name)
    except FileNotFoundError:
        return


def _opened(location: str | Dir, create: bool = False) -> tuple[Dir, bool]:
    """(`location` open, whether the caller must close it)."""
    if isinstance(location, Dir):
        return location, False
    return open_location(location, create=create), True


def read_owner(location: str | Dir) -> dict[str, Any] | None:
    """The owner record of `location` (a path, or the `LiveLock.dir` of it), or None
    when it is missing, unreadable, too large or behind a link."""
    try:
        directory, close = _opened(location)
    except (OSError, InvalidPath):
        return None
    try:
        data = bounded.decode(directory.read(OWNER_NAME, _OWNER_MAX_BYTES), _OWNER_LIMITS, OWNER_NAME)
    except (OSError, ValueError):  # CorruptRecord, ObjectTooLarge and InvalidPath are ValueErrors
        return None
    finally:
        if close:
            directory.close()
    return data if isinstance(data, dict) else None


def write_owner(location: str | Dir, owner: Mapping[str, Any]) -> None:
    """Record `owner` in `location` (a path, or the `LiveLock.dir` of it: the location
    that was locked, whatever its name points to now).

    :raises InvalidPath: the location is a link.
    """
    directory, close = _opened(location, create=True)
    try:
        directory.write(OWNER_NAME, json.dumps(dict(owner)).encode(), fsync=False)
    finally:
        if close:
            directory.close()


def owner_record(job: str, generation: int, jvm_pid: int | None) -> dict[str, Any]:
    """Who owns a location: this process (and its JVM) for `generation`."""
    pid = os.getpid()
    return {"job": job, "generation": generation, "host": socket.gethostname(), "pid": pid,
            "pid_start": process_start(pid), "jvm_pid": jvm_pid or 0,
            "jvm_start": process_start(jvm_pid) if jvm_pid else None}


def previous_owner_gone(
    location: str,
    owner: Mapping[str, Any] | None,
    status: JobStatus | None,
    *,
    own: Iterable[tuple[int, str | None]] = (),
) -> tuple[bool, str]:
    """Whether the run that last used `location` is proven gone (the caller holds its lock),
    and why. `status` is the job's status record; `own` lists (pid, start) of this process
    and its JVM (a previous run in the same process ended when it released the lock)."""
    mine = set(own)
    same_dir = status is not None and _same(status.live_dir, location)
    if owner is None:
        # A location of an older release, or one never owned: only the status record tells.
        if same_dir and status is not None and status.state in TERMINAL_STATES:
            return True, f"generation {status.generation} ended ({status.state})"
        if same_dir and status is not None and status.host == socket.gethostname():
            pid = int(status.pid or 0)
            if pid and not process_alive(pid, None):
                return True, f"process {pid} of generation {status.generation} is gone"
        return False, "its previous owner is unknown and not proven gone"
    generation = owner.get("generation")
    if (status is not None and status.generation == generation and same_dir
            and status.state in TERMINAL_STATES):
        return True, f"generation {generation} ended ({status.state})"
    if owner.get("host") != socket.gethostname():
        return False, f"generation {generation} ran on host {owner.get('host')!r} and is not proven gone"
    for key in ("pid", "jvm_pid"):
        pid = int(owner.get(key) or 0)
        start = owner.get("pid_start" if key == "pid" else "jvm_start")
        if pid and (pid, start) not in mine and process_alive(pid, start):
            return False, f"process {pid} of generation {generation} is still running"
    return True, f"the processes of generation {generation} are gone"


def clear(location: str | Dir) -> None:
    """Empty `location` (a path, created if missing, or the `LiveLock.dir` of it), keeping
    its lock and owner files; a link in it is unlinked, never followed.

    :raises InvalidPath: the location is a link.
    """
    directory, close = _opened(location, create=True)
    try:
        directory.clear(keep=(LOCK_NAME, OWNER_NAME))
    finally:
        if close:
            directory.close()


def remove_unowned(work_root: str, keep: str, below_generation: int) -> list[str]:
    """Delete ``g<N>`` locations under `work_root` older than `below_generation` whose
    lock is free (their runs ended); never `keep`, never one a running generation holds.

    Deleting a tree removes its lock file before the rest: another run could then lock
    the half-deleted location and resume in place on it. So each is first renamed, under
    its lock, out of the ``g<N>`` names (`TRASH_PREFIX`), then deleted; what a deletion
    killed halfway left is deleted by the next call. A ``g<N>`` that is a link (planted:
    Sparkpoint makes directories) is unlinked, never locked or deleted through."""
    removed: list[str] = []
    try:
        root = Dir.open(work_root)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    current = os.path.basename(keep.rstrip("/"))
    with root:
        for entry in root.entries():
            name = entry.name
            if name.startswith(TRASH_PREFIX):
                root.remove_tree(name)
                continue
            if (not (name.startswith("g") and name[1:].isdigit()) or name == current
                    or int(name[1:]) >= below_generation):
                continue
            path = os.path.join(work_root, name)
            if not entry.is_dir(follow_symlinks=False):
                log.warning("removing %s from the work root: a %s where Sparkpoint keeps live locations",
                            path, "link" if entry.is_symlink() else "file")
                root.unlink(name)
                continue
            try:
                lock = try_lock(path)
            except OSError as exc:  # replaced by a link meanwhile: the next call looks again
                log.warning("could not remove live location %s: %s", path, exc)
                continue
            if lock is None:
                log.info("keeping live location %s: a run still holds it", path)
                continue
            trash = f"{TRASH_PREFIX}{name}-{uuid.uuid4().hex}"
            try:
                root.rename(name, root, trash)
            except OSError as exc:
                log.warning("could not remove live location %s: %s", path, exc)
                continue
            finally:
                lock.release()
            root.remove_tree(trash)
            removed.append(path)
    return removed


def _same(a: Any, b: str) -> bool:
    if not isinstance(a, str) or not a:
        return False
    pa, pb = local_path_of(a), local_path_of(b)
    return pa is not None and pb is not None and os.path.realpath(pa) == os.path.realpath(pb)
