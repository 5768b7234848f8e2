"""What the file sinks (`S3Sink`, `DirectorySink`) share: transaction-keyed names and the
per-batch manifest.

The manifest ``<dest>/_sparkpoint/manifests/<job>/<batch>.json`` is the batch's *claim*
(`_claims`): created atomically *before* any file of the batch becomes visible, it names
the one transaction (job, batch, generation) that promotes the batch and the files it
makes visible, and is marked ``done`` once they are. It is the "did it land?" marker of
invariant 3. Manifests of the previous release (written last, without a state) read as
done claims. The leading ``_`` keeps Spark and Hadoop readers from listing it as data.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import bounded
from airflow_sparkpoint.checkpoints.bounded import Limits
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, InvalidPath, SinkError
from airflow_sparkpoint.storage import Storage
from airflow_sparkpoint.storage.base import normalize_prefix
from airflow_sparkpoint.storage.endpoints import S3_OPTIONS

log = logging.getLogger(__name__)

MANIFESTS = "_sparkpoint/manifests"
#: markers of claimed batches, newest first (`marker_key`): what `committed_position` reads
MARKERS = "_sparkpoint/claimed"
#: markers kept below a new claim's batch; older ones go in steps (`stale_markers`)
MARKERS_KEPT = 64
# Spark's batch ids are longs: 19 digits hold them all
_MARKER_SPAN = 10**19
_MARKER_NAME_RE = re.compile(r"^\d{19}$")
STAGING = "_staging"
_MANIFEST_NAME_RE = re.compile(r"^(\d+)\.json$")
#: the largest claim or decision object read (they list a batch's files, as its
#: transaction record does, `checkpoints.layout` ``txn``, and the files it makes visible),
#: and the memory its parse may take (`checkpoints.bounded`); beyond either the object is
#: corrupt: the output location is shared, a planted one could be any size or shape
RECORD_LIMITS = Limits(max_bytes=24 * 1024 * 1024, max_cost=160 * 1024 * 1024)
RECORD_MAX_BYTES = RECORD_LIMITS.max_bytes
_PART_RE = re.compile(r"^part-(?P<txn>.+)-(?P<index>\d+)\.(?P<ext>[a-z]+)$")


def part_prefix(txn: str) -> str:
    """What the names of transaction `txn`'s files start with (given a job name instead:
    the files of every transaction of that job, and possibly of a job named like it)."""
    return f"part-{txn}-"


def final_name(txn: str, index: int, ext: str) -> str:
    """The deterministic name of the `index`-th file of transaction `txn` once committed."""
    return f"{part_prefix(txn)}{index:05d}" + (f".{ext}" if ext else "")


def part_txn(name: str) -> str | None:
    """The transaction id in a file name ``part-<txn>-<index>.<ext>``, or None."""
    match = _PART_RE.match(name)
    return match.group("txn") if match else None


def manifest_key(job: str, batch_id: int) -> str:
    return f"{MANIFESTS}/{job}/{batch_id}.json"


def read_record(store: Storage, key: str) -> dict[str, Any] | None:
    """The claim or decision object at `key` of a sink's output location (None: none),
    read within `RECORD_LIMITS`.

    :raises SinkError: it is over its limits, not JSON or not a JSON object (the message
        names it).
    """
    def parse(raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON {type(raw).__name__}, not an object")
        return raw

    try:
        return bounded.read_record(store, key, parse, limits=RECORD_LIMITS, where=f"{store.uri}/{key}")
    except CorruptRecord as exc:
        raise SinkError(f"unreadable sink record {exc}; expected the JSON "
                        "written by a Sparkpoint sink") from None


def read_manifest(store: Storage, job: str, batch_id: int) -> dict[str, Any] | None:
    """The claim (manifest) of batch `batch_id` of `job`, or None when the batch has none.

    :raises SinkError: it is unreadable (`read_record`).
    """
    return read_record(store, manifest_key(job, batch_id))


def claimed_batches(store: Storage, job: str) -> list[int]:
    """Every batch of `job` with a claim (a manifest) in `store`, ascending (one listing)."""
    batches = []
    for info in store.list(f"{MANIFESTS}/{job}"):
        match = _MANIFEST_NAME_RE.match(info.key[len(f"{MANIFESTS}/{job}/"):])
        if match:
            batches.append(int(match.group(1)))
    return sorted(batches)


def marker_key(job: str, batch_id: int) -> str:
    """The marker a claimer writes before it claims batch `batch_id` (`_claims._take`); keys
    sort the newest batch first, so the newest is the first key a listing returns."""
    return f"{MARKERS}/{job}/{_MARKER_SPAN - 1 - batch_id:019d}"


def stale_markers(job: str, batch_id: int) -> list[str]:
    """The markers a claim of `batch_id` makes stale, deleted after it (one step of
    `MARKERS_KEPT` every `MARKERS_KEPT` batches): `committed_position` reads markers from
    the newest down to the first whose claim exists, and a claim is never released by
    Sparkpoint, so markers well below a claim are never needed. One a step misses (a
    failed delete; a step's batch claimed by an earlier release) stays: an empty object."""
    if batch_id % MARKERS_KEPT or batch_id < 2 * MARKERS_KEPT:
        return []
    return [marker_key(job, b) for b in range(batch_id - 2 * MARKERS_KEPT, batch_id - MARKERS_KEPT)]


def committed_position(store: Storage, job: str) -> int | None:
    """The highest batch of `job` with a claim in `store`, or None. A claim is a commit
    (`_claims`): it is written only for a transaction that decided to promote, and is
    never released, so its batch counts even while its promotion is being finished.

    Claims are kept for ever (one per batch), so they are not listed: the newest marker
    whose claim exists names the newest claim of this release (each claim is preceded by
    its marker; a marker alone is a claimer that died before claiming), and the batch
    right after it is looked at. Every claim is listed when that batch is claimed (by a
    process of an earlier release, which writes no marker) or when no marker names a
    claim (a job whose claims are all an earlier release's). Reads only."""
    prefix = f"{MARKERS}/{job}/"
    newest = None
    looked = 0
    for info in store.list(prefix):
        name = info.key[len(prefix):]
        if not _MARKER_NAME_RE.match(name):
            continue  # not a marker's name: planted
        batch = _MARKER_SPAN - 1 - int(name)
        if store.exists(manifest_key(job, batch)):
            newest = batch
            break
        looked += 1
        if looked > MARKERS_KEPT:  # that many dead claimers do not happen: planted; list the claims
            break
    if newest is None:
        batches = claimed_batches(store, job)
        if not batches:
            return None
        newest = batches[-1]
    if not store.exists(manifest_key(job, newest + 1)):
        return newest
    # A claim without a marker: a process of an earlier release commits to this job, and
    # may have left a gap (a stuck claim released by hand). Only a listing finds its newest.
    return claimed_batches(store, job)[-1]


def s3_destination(bucket: str, path: str) -> tuple[str, str]:
    """``(prefix, uri)`` of the destination ``s3://<bucket>/<path>``: the key prefix with
    a trailing ``/`` ("" at the bucket root) and the URI without one. Slashes at the ends
    of `path` go; nothing else is rewritten (S3 keys are literal).

    :raises ConfigError: `path` is not a canonical key prefix (the storage's rule,
        `normalize_prefix`: an empty, ``.`` or ``..`` segment).
    """
    try:
        prefix = normalize_prefix(path.strip("/"))
    except InvalidPath as exc:
        raise ConfigError(f"S3 destination s3://{bucket}/{path} is not a "
                          f"canonical key prefix ({exc})") from None
    return prefix, f"s3://{bucket}/{prefix.rstrip('/')}" if prefix else f"s3://{bucket}"


def options_from(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The S3 connection options Sparkpoint passes around, without empty values.

    Empty means "use boto3's default chain": environment, ``~/.aws``, instance role.
    """
    options = dict(storage_options or {})
    unknown = sorted(set(options) - set(S3_OPTIONS))
    if unknown:
        log.debug("ignoring unknown storage options %s", unknown)
    return {k: options[k] for k in S3_OPTIONS if options.get(k) not in (None, "")}
