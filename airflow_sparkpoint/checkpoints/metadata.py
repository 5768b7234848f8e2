"""The metadata model: immutable records with versioned JSON and a checksum.

A snapshot (checkpoint or savepoint) is described by one `SnapshotMetadata` written as
``_metadata``. It lists every file Spark needs to restart after batch ``batch_id`` with
its size and checksum, the sink transactions that were pending when it was taken, and
its statistics. ``_metadata`` is written last: it is the completion marker.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from airflow_sparkpoint.checkpoints import bounded, spark_layout
from airflow_sparkpoint.checkpoints.batch_owners import BatchOwners
from airflow_sparkpoint.checkpoints.layout import METADATA, limits_of, txn_id
from airflow_sparkpoint.exceptions import CorruptMetadata
from airflow_sparkpoint.storage.base import normalize_key

__all__ = ["SCHEMA_VERSION", "FileRef", "SnapshotKind", "SnapshotMetadata", "SnapshotStats",
           "TransactionRecord", "canonical_json", "foreign_to", "sha256_hex"]

SCHEMA_VERSION = 1
#: list elements encoded at a time for a checksum (`_canonical_sha256`)
_CHECKSUM_SLICE = 1024
SnapshotKind = Literal["checkpoint", "savepoint"]


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace) used for checksums."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _canonical_sha256(body: Mapping[str, Any]) -> str:
    """``sha256_hex(canonical_json(body))`` without the whole canonical text in memory: the
    lists at its top level (a snapshot's files) are encoded a slice at a time."""
    digest = hashlib.sha256()
    digest.update(b"{")
    for index, key in enumerate(sorted(body)):
        value = body[key]
        digest.update((b"," if index else b"") + canonical_json(key) + b":")
        if isinstance(value, list):
            digest.update(b"[")
            for start in range(0, len(value), _CHECKSUM_SLICE):
                # "[a,b]" without its brackets is the slice's part of the list's text
                digest.update((b"," if start else b"")
                              + canonical_json(value[start:start + _CHECKSUM_SLICE])[1:-1])
            digest.update(b"]")
        else:
            digest.update(canonical_json(value))
    digest.update(b"}")
    return digest.hexdigest()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _finite(value: Any, what: str) -> float:
    """`value` as a finite float; ValueError (caught as corruption) for NaN or Infinity."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} {value!r} is not a finite number")
    return number


def _canonical_key(key: str, what: str = "file key") -> str:
    """`key` if it is a plain relative path; ValueError (caught as corruption) if not."""
    if normalize_key(key) != key:  # InvalidPath, a ValueError, on '..', '.', '//' or empty keys
        raise ValueError(f"{what} {key!r} is not a plain relative path")
    return key


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file of Spark's checkpoint location as captured in a snapshot.

    `path` is where the file lives inside Spark's checkpoint location (``state/0/1/3.zip``);
    `key` is where its bytes are stored, relative to the job root for checkpoints and to
    the savepoint directory for savepoints.
    """

    path: str
    key: str
    size: int
    sha256: str
    mtime_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        # Not `asdict` (a deep copy of every field): a checkpoint lists every file of the
        # live location, hundreds, and `_metadata` is written on the coordinator's thread
        # while Spark's Python thread waits for the GIL.
        return {"path": self.path, "key": self.key, "size": self.size, "sha256": self.sha256,
                "mtime_ns": self.mtime_ns}

    def stored_problem(self, stored: int | None) -> str | None:
        """What is wrong with this file as a store holds it with `stored` bytes (None: not
        there): ``"<key> is missing"``, ``"<key> has N bytes, expected M"``, or None."""
        if stored is None:
            return f"{self.key} is missing"
        if stored != self.size:
            return f"{self.key} has {stored} bytes, expected {self.size}"
        return None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileRef:
        return cls(
            # `path` is joined to the live location on restore: '..' would write outside it.
            path=_canonical_key(str(data["path"]), "file path"),
            key=_canonical_key(str(data["key"])),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            mtime_ns=int(data.get("mtime_ns", 0)),
        )


@dataclass(frozen=True)
class SnapshotStats:
    """The fields Flink's checkpoint history shows."""

    duration_ms: int = 0
    bytes_copied: int = 0
    files_copied: int = 0
    bytes_total: int = 0
    file_count: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SnapshotStats:
        return cls(**{k: int(data.get(k, 0)) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class TransactionRecord:
    """A sink transaction's pre-commit record, keyed by (job, batch, generation).

    `payload` is the sink's own JSON description of what was staged (file list, upload
    ids and ETags, Delta add actions); `sink` names the sink class that can commit it.
    """

    job: str
    batch_id: int
    generation: int
    sink: str
    sink_id: str
    payload: Mapping[str, Any]
    created_at: float = 0.0

    @property
    def txn_id(self) -> str:
        return txn_id(self.job, self.batch_id, self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "job": self.job,
            "batch_id": self.batch_id,
            "generation": self.generation,
            "sink": self.sink,
            "sink_id": self.sink_id,
            "payload": dict(self.payload),
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TransactionRecord:
        version = int(data.get("schema_version", 0))
        if version > SCHEMA_VERSION:
            raise CorruptMetadata(f"transaction record has schema_version {version}; this release "
                                  f"reads <= {SCHEMA_VERSION}")
        return cls(
            job=str(data["job"]),
            batch_id=int(data["batch_id"]),
            generation=int(data["generation"]),
            sink=str(data["sink"]),
            sink_id=str(data.get("sink_id", "")),
            payload=dict(data["payload"]),
            created_at=float(data.get("created_at", 0.0)),
        )


def foreign_to(record: TransactionRecord, job: str, *, restored_job: str | None = None) -> str | None:
    """Why `record` is not job `job`'s to settle, or None when it is: the one rule of who
    settles a transaction (every path that commits or aborts one applies it: the catalog's
    reader of records, `sinks.resolve.resolve_sink`). A record names the job whose
    transaction it is; any other job's is that job's alone (its staging lives in a sink
    both may share, so one job's store writer could otherwise abort another's). A restore
    of another job's snapshot (``restore.allowForeignJob``) also takes the transactions
    that snapshot lists for its job, `restored_job`, as its predecessor would have."""
    if record.job == job or (restored_job is not None and record.job == restored_job):
        return None
    return (f"transaction record {record.txn_id} belongs to job {record.job!r}, not "
            f"{job!r}; refused (a record "
            "of another job is forged, or that job's to settle)")


@dataclass(frozen=True)
class SnapshotMetadata:
    """The `_metadata` of a checkpoint or savepoint."""

    kind: SnapshotKind
    id: int
    job: str
    generation: int
    batch_id: int
    created_at: float
    files: tuple[FileRef, ...]
    live_root: str = ""
    transactions: tuple[TransactionRecord, ...] = ()
    sink_positions: Mapping[str, Any] = field(default_factory=dict)
    stats: SnapshotStats = field(default_factory=SnapshotStats)
    spark: Mapping[str, Any] = field(default_factory=dict)
    source_checkpoint: int | None = None
    #: which generation staged each batch of its lineage (`batch_owners`; empty from an
    #: earlier release)
    batch_owners: BatchOwners = field(default_factory=BatchOwners)
    schema_version: int = SCHEMA_VERSION

    def with_(self, **changes: Any) -> SnapshotMetadata:
        return replace(self, **changes)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def partitions_by_operator(self) -> dict[int, int]:
        """Number of state partitions of each stateful operator, from the snapshot's own
        files (``state/<operator>/<partition>/...``); empty for a stateless query."""
        seen: dict[int, set[int]] = {}
        for ref in self.files:
            in_state = spark_layout.state_partition(ref.path)
            if in_state is not None and in_state[1] is not None:
                seen.setdefault(in_state[0], set()).add(in_state[1])
        return {op: len(partitions) for op, partitions in sorted(seen.items())}

    @property
    def state_partitions(self) -> int | None:
        """The number of state partitions (the largest over operators), or None if stateless."""
        counts = self.partitions_by_operator
        return max(counts.values()) if counts else None

    def _body(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "id": self.id,
            "job": self.job,
            "generation": self.generation,
            "batch_id": self.batch_id,
            "created_at": self.created_at,
            "files": [f.to_json() for f in self.files],
            "live_root": self.live_root,
            "transactions": [t.to_json() for t in self.transactions],
            "sink_positions": dict(self.sink_positions),
            "stats": self.stats.to_json(),
            "spark": dict(self.spark),
            "source_checkpoint": self.source_checkpoint,
            **({"batch_owners": self.batch_owners.to_json()} if self.batch_owners.ranges else {}),
        }

    def to_json(self) -> dict[str, Any]:
        body = self._body()
        body["checksum"] = "sha256:" + sha256_hex(canonical_json(body))
        return body

    def to_bytes(self) -> bytes:
        # UTF-8 rather than \u escapes: an escape's hex digits could change case without
        # changing the content, so every byte of the file then matters to the checksum.
        return json.dumps(self.to_json(), sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "_metadata") -> SnapshotMetadata:
        """Parse and verify `_metadata` bytes.

        :raises CorruptMetadata: not JSON, over the limits of a ``_metadata``
            (`CorruptRecord`: bytes, memory, nesting), wrong shape, unknown schema version or
            bad checksum; the message names `where`.
        """
        raw = bounded.decode(data, limits_of(METADATA), where)
        if not isinstance(raw, dict):
            raise CorruptMetadata(f"{where}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_json(raw, where=where)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, where: str = "_metadata") -> SnapshotMetadata:
        body = dict(raw)
        checksum = body.pop("checksum", None)
        if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
            raise CorruptMetadata(f"{where}: missing checksum")
        if "sha256:" + _canonical_sha256(body) != checksum:
            raise CorruptMetadata(f"{where}: checksum mismatch (the file was modified or truncated)")
        version = body.get("schema_version")
        if (isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION
                or version < 1):
            raise CorruptMetadata(
                f"{where}: schema_version {version!r} is not supported; this release "
                f"reads 1..{SCHEMA_VERSION}"
            )
        try:
            kind = body["kind"]
            if kind not in ("checkpoint", "savepoint"):
                raise ValueError(f"kind {kind!r}")
            return cls(
                kind=kind,
                id=int(body["id"]),
                job=str(body["job"]),
                generation=int(body["generation"]),
                batch_id=int(body["batch_id"]),
                created_at=_finite(body["created_at"], "created_at"),
                files=tuple(FileRef.from_json(f) for f in body["files"]),
                live_root=str(body.get("live_root", "")),
                transactions=tuple(TransactionRecord.from_json(t) for t in body.get("transactions", [])),
                sink_positions=dict(body.get("sink_positions", {})),
                stats=SnapshotStats.from_json(body.get("stats", {})),
                spark=dict(body.get("spark", {})),
                source_checkpoint=(None if body.get("source_checkpoint") is None
                                   else int(body["source_checkpoint"])),
                batch_owners=BatchOwners.from_json(body.get("batch_owners"), where=f"{where}: batch_owners"),
                schema_version=version,
            )
        except (KeyError, TypeError, ValueError, ArithmeticError, AttributeError) as exc:
            # ArithmeticError: int() of an Infinity; AttributeError: a list where an object belongs
            raise CorruptMetadata(f"{where}: malformed field ({exc.__class__.__name__}: {exc})") from None
