"""What the file sinks (`S3Sink`, `DirectorySink`) share: transaction-keyed names and the
per-batch commit manifest.

A manifest ``<dest>/_sparkpoint/manifests/<job>/<batch>.json`` is written *last* by a
commit, with an atomic create: it is the "did it land?" marker of invariant 3. It names
the transaction (job, batch, generation) that committed the batch and the files it made
visible, so a second transaction for the same batch (a re-run in another generation) is
refused instead of duplicating output. The leading ``_`` keeps Spark and Hadoop readers
from ever listing it as data.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import ObjectExists, ObjectNotFound, SinkError
from airflow_sparkpoint.storage import Storage

log = logging.getLogger(__name__)

MANIFEST_SCHEMA_VERSION = 1
MANIFESTS = "_sparkpoint/manifests"
STAGING = "_staging"
#: ``<job>-b<batch>-g<generation>`` (`StageContext.txn_id`); job names may contain ``-``,
#: so the greedy job group backtracks to the fixed-form suffix.
TXN_RE = re.compile(r"^(?P<job>.+)-b(?P<batch>\d+)-g(?P<gen>\d+)$")
_MANIFEST_NAME_RE = re.compile(r"^(\d+)\.json$")


def txn_id(job: str, batch_id: int, generation: int) -> str:
    return f"{job}-b{batch_id}-g{generation}"


def parse_txn(name: str) -> tuple[str, int, int] | None:
    """``(job, batch, generation)`` of a transaction id, or None if `name` is not one."""
    match = TXN_RE.match(name)
    if not match:
        return None
    return match.group("job"), int(match.group("batch")), int(match.group("gen"))


def final_name(txn: str, index: int, ext: str) -> str:
    """The deterministic name of the `index`-th file of transaction `txn` once committed."""
    return f"part-{txn}-{index:05d}" + (f".{ext}" if ext else "")


def manifest_key(job: str, batch_id: int) -> str:
    return f"{MANIFESTS}/{job}/{batch_id}.json"


def read_manifest(store: Storage, job: str, batch_id: int) -> dict[str, Any] | None:
    """The manifest of batch `batch_id` of `job`, or None when the batch never landed."""
    try:
        data = store.get(manifest_key(job, batch_id))
    except ObjectNotFound:
        return None
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise SinkError(
            f"commit manifest {store.uri}/{manifest_key(job, batch_id)} is unreadable ({exc}); "
            "expected the JSON written by a Sparkpoint commit"
        ) from None
    if not isinstance(body, dict):
        raise SinkError(f"commit manifest {store.uri}/{manifest_key(job, batch_id)} is not a JSON object")
    return body


def is_committed(store: Storage, record: TransactionRecord) -> bool:
    """Whether this very transaction committed (its batch's manifest names its txn id)."""
    body = read_manifest(store, record.job, record.batch_id)
    return body is not None and body.get("txn_id") == record.txn_id


def check_not_taken(store: Storage, record: TransactionRecord) -> bool:
    """True when `record` already committed; False when the batch is free.

    :raises SinkError: another transaction (another generation) committed the batch:
        committing this one too would duplicate the batch's output.
    """
    body = read_manifest(store, record.job, record.batch_id)
    if body is None:
        return False
    if body.get("txn_id") == record.txn_id:
        return True
    raise SinkError(
        f"batch {record.batch_id} of job {record.job!r} was already committed to {store.uri} by "
        f"transaction {body.get('txn_id')!r}; refusing to commit {record.txn_id!r} as well "
        "(it would duplicate the batch); abort it instead"
    )


def write_manifest(
    store: Storage,
    record: TransactionRecord,
    *,
    sink_id: str,
    fmt: str,
    files: Sequence[Mapping[str, Any]],
) -> bool:
    """Create the manifest of `record` atomically; True if written now, False if it was there.

    :raises SinkError: another transaction holds the batch's manifest.
    """
    body = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "job": record.job,
        "batch_id": record.batch_id,
        "generation": record.generation,
        "txn_id": record.txn_id,
        "sink_id": sink_id,
        "format": fmt,
        "files": [dict(f) for f in files],
        "bytes": sum(int(f.get("size", 0)) for f in files),
        "committed_at": time.time(),
    }
    try:
        store.put_if_absent(manifest_key(record.job, record.batch_id), json.dumps(body, sort_keys=True).encode())
    except ObjectExists:
        check_not_taken(store, record)  # raises if another transaction won
        return False
    return True


def committed_position(store: Storage, job: str) -> int | None:
    """The highest batch of `job` with a manifest in `store`, or None."""
    best: int | None = None
    for info in store.list(f"{MANIFESTS}/{job}"):
        rest = info.key[len(f"{MANIFESTS}/{job}/"):]
        match = _MANIFEST_NAME_RE.match(rest)
        if match:
            batch = int(match.group(1))
            best = batch if best is None else max(best, batch)
    return best


def options_from(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The S3 connection options Sparkpoint passes around, without empty values.

    Empty means "use boto3's default chain": environment, ``~/.aws``, instance role.
    """
    known = ("endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key", "aws_session_token")
    options = dict(storage_options or {})
    unknown = sorted(set(options) - set(known))
    if unknown:
        log.debug("ignoring unknown storage options %s", unknown)
    return {k: options[k] for k in known if options.get(k) not in (None, "")}
