"""The names inside Spark's own checkpoint location, built and parsed here only.

A snapshot copies these files (`FileRef.path` is relative to the location, ``/``-separated);
the runtime reads them in the live location. Pure names: no Spark, no IO.

::

    offsets/<batch>                                    offset log
    commits/<batch>                                    commit log
    sources/<index>/<batch>[.compact]                  file source logs
    state/<op>/<partition>[/<store>]/<version>[_<uuid>].{delta,snapshot,changelog,zip}
    state/<op>/<partition>/SSTs/<name>.sst             RocksDB files (version-less)
    state/<op>/_metadata/metadata                      operator metadata, v1 (unversioned)
    state/<op>/_metadata/v2/<batch>                    operator metadata, v2
"""

from __future__ import annotations

import re

__all__ = ["COMMITS", "COMPACT", "LOG_LINE_MAX_BYTES", "OFFSETS", "ROCKSDB_KINDS", "SNAPSHOT_KINDS",
           "SOURCES", "STATE", "commits_entry", "compact_name", "has_unique_id", "is_partition_dir",
           "is_rocksdb_sst", "log_entry", "offsets_entry", "operator_metadata", "operator_metadata_v1",
           "state_partition", "state_version"]

OFFSETS = "offsets"
COMMITS = "commits"
SOURCES = "sources"
STATE = "state"
COMPACT = ".compact"
#: snapshot kinds of a state store version (the others, changelog and delta, replay onto one)
SNAPSHOT_KINDS = ("zip", "snapshot")
#: the kinds the RocksDB provider writes (the HDFS provider: delta, snapshot)
ROCKSDB_KINDS = ("zip", "changelog")
#: the longest line read from a file source log (one input file's entry; the files are
#: read line by line, a compact file of a job of weeks holds millions of them)
LOG_LINE_MAX_BYTES = 1024 * 1024

_LOG_ENTRY = re.compile(r"^(\d+)(\.compact)?$")
_STATE_VERSION = re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(delta|snapshot|changelog|zip)$")
_OPERATOR_METADATA = re.compile(r"^state/([^/]+)/_metadata/(?:metadata|v2/(\d+))$")
_ROCKSDB_SST = re.compile(r"^state/.+/SSTs/[^/]+\.sst$")
_PARTITION_DIR = re.compile(r"^\d+$")


def offsets_entry(batch_id: int) -> str:
    return f"{OFFSETS}/{batch_id}"


def commits_entry(batch_id: int) -> str:
    return f"{COMMITS}/{batch_id}"


def operator_metadata_v1(operator: str) -> str:
    """The unversioned (v1) operator metadata file of `operator`."""
    return f"{STATE}/{operator}/_metadata/metadata"


def compact_name(batch_id: int) -> str:
    """The name of a compacted source log entry (it holds every entry up to `batch_id`)."""
    return f"{batch_id}{COMPACT}"


def log_entry(name: str) -> tuple[int, bool] | None:
    """``(batch, compacted)`` of a log entry's file name (``7``, ``9.compact``), or None."""
    match = _LOG_ENTRY.match(name)
    if not match:
        return None
    return int(match.group(1)), match.group(2) is not None


def state_version(name: str) -> tuple[int, str] | None:
    """``(version, kind)`` of a state store file name (``3.zip``, ``4_<uuid>.changelog``),
    kind one of delta, snapshot, changelog, zip; None for any other name."""
    match = _STATE_VERSION.match(name)
    if not match:
        return None
    return int(match.group(1)), match.group(2)


def has_unique_id(name: str) -> bool:
    """Whether a state store file name carries a unique id (``4_<uuid>.changelog``: Spark's
    checkpoint format v2, where the commit log's lineage, not the newest name, picks the file)."""
    return "_" in name.partition(".")[0]


def operator_metadata(path: str) -> tuple[str, int | None] | None:
    """``(operator, batch)`` of an operator metadata file (`path` relative): batch is the
    v2 version, None for the unversioned v1 ``metadata``; None for any other path."""
    match = _OPERATOR_METADATA.match(path)
    if not match:
        return None
    return match.group(1), int(match.group(2)) if match.group(2) else None


def state_partition(path: str) -> tuple[int, int | None] | None:
    """``(operator, partition)`` of a path under ``state/<op>/``; partition is None when
    the next component is not a partition directory (``_metadata``); None outside state."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != STATE or not parts[1].isdigit():
        return None
    return int(parts[1]), int(parts[2]) if len(parts) >= 4 and parts[2].isdigit() else None


def is_partition_dir(name: str) -> bool:
    """Whether `name` (one component under ``state/<op>/``) is a state partition directory."""
    return bool(_PARTITION_DIR.match(name))


def is_rocksdb_sst(path: str) -> bool:
    """Whether `path` (relative) is an SST file of Spark's RocksDB state store, which its
    maintenance writes in place (not renamed into place) before the snapshot naming it."""
    return bool(_ROCKSDB_SST.match(path))
