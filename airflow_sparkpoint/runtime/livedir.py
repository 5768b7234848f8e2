"""Spark's live checkpoint location: what a restart after batch N needs, and how to
rebuild a location from a snapshot.

Spark writes every file of its checkpoint location atomically (temp file + rename) and
never changes it afterwards, except when a batch is re-executed; so a file is identified
by (path, size, mtime) and copied to Sparkpoint storage once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from airflow_sparkpoint.exceptions import ConfigError

_VERSIONED_STATE = re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(delta|snapshot|changelog|zip)$")
_LOG_ENTRY = re.compile(r"^(\d+)(\.compact)?$")
_OP_METADATA_V2 = re.compile(r"^state/[^/]+/_metadata/v2/(\d+)$")


@dataclass(frozen=True)
class LiveFile:
    path: str  # relative, '/'-separated
    abspath: str
    size: int
    mtime_ns: int


def local_path_of(location: str) -> str | None:
    """The local filesystem path of a Hadoop location, or None when it is not local."""
    if location.startswith("file://"):
        return location[len("file://"):] or "/"
    if location.startswith("file:/"):
        return location[len("file:"):]
    if "://" not in location:
        return os.path.abspath(location)
    return None


def require_local(location: str) -> str:
    """:raises ConfigError: the live location is not on a local filesystem."""
    path = local_path_of(location)
    if path is None:
        raise ConfigError(
            f"spark.sparkpoint.workDir={location!r}: this release captures live checkpoints from local "
            "filesystem paths only; use a local path (retained checkpoints still go to spark.sparkpoint.dir)"
        )
    return path


def walk(root: str) -> Iterator[LiveFile]:
    """Every regular file under `root`, skipping Hadoop checksums and temp files."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or name.endswith((".crc", ".tmp")) or "sparkpoint-tmp" in name:
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            yield LiveFile(rel, full, st.st_size, st.st_mtime_ns)


def needed_for_restart(path: str, batch_id: int) -> bool:
    """Whether the file at `path` belongs to the restart point after batch `batch_id`.

    Logs (offsets, commits, source logs, operator metadata) up to `batch_id`; state
    store versions up to ``batch_id + 1`` (the state after batch N is version N+1);
    everything version-less (SST files, schemas, the query metadata) always.
    """
    parts = path.split("/")
    name = parts[-1]
    if parts[0] in ("offsets", "commits") and len(parts) == 2:
        match = _LOG_ENTRY.match(name)
        return match is not None and int(match.group(1)) <= batch_id
    if parts[0] == "sources":
        match = _LOG_ENTRY.match(name)
        return not match or int(match.group(1)) <= batch_id
    if parts[0] == "state":
        v2 = _OP_METADATA_V2.match(path)
        if v2:
            return int(v2.group(1)) <= batch_id
        match = _VERSIONED_STATE.match(name)
        if match:
            return int(match.group(1)) <= batch_id + 1
        return True
    return True


def last_commit(root: str) -> int | None:
    """The highest batch id with a ``commits/<id>`` file in a live location, or None."""
    try:
        names = os.listdir(os.path.join(root, "commits"))
    except FileNotFoundError:
        return None
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None
