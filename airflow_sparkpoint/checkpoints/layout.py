"""Where things live under ``<dir>/<job>/`` (in the spirit of Flink's layout).

::

    <job>/chk-<id>/_metadata                      completed checkpoint (written last)
    <job>/shared/<path>~<sha16>                  files shared by checkpoints (content-addressed)
    <job>/savepoints/savepoint-<id>-<suffix>/_metadata, files/<path>
    <job>/generations/<generation>                one object per job start (atomic create)
    <job>/lineage/<generation>.json               what that generation started from (its origin)
    <job>/pins/<generation>/_metadata, files/<path>  a copy of the checkpoint that generation restored by path
    <job>/gc/<epoch-ms>-<suffix>.json             journal of shared files retention is deleting
    <job>/txn/<batch>-g<generation>.json          sink pre-commit records
    <job>/status.json                             heartbeat and state of the current run
    <job>/status/<generation>.json                the same record, written only by that generation
    <job>/control/<request-id>.{request,ack,result}.json
    <job>/cutover/<cutover-id>.{plan,agreed,claimed,done,rollback}.json   a zero-downtime cutover (write-once)
    <job>/cutover/<cutover-id>.decision.json      green's claim or the call-off, the first (write-once)
    <job>/cutover/<cutover-id>.green.json         green's warm-up progress (overwritten)
    <job>/results/<generation>.json               the run result of a generation
    <job>/launches/<token>.json                   where a submit started its driver (a detached
                                                  process, a Kubernetes pod, a YARN application)
    <job>/last-disposed-id                        highest id ever disposed (ids are never reused)
    <job>/checkpoint-counters.json                lifetime checkpoint counts and recent outcomes
    <job>/committed.json                          the newest sink commit (`commit_head`: asset watchers)
    <job>/chk-<id>/_verification.json, savepoints/<name>/_verification.json  last restore drill

Every record read from a job's keys is bounded (`limits_of`, `JobStore`, read through
`checkpoints.bounded`): whoever can write the store could plant a multi-GB
``status.json``, or a small one that parses to gigabytes, to take a reader down.

A sink transaction is named ``<job>-b<batch>-g<generation>`` (`txn_id`, `parse_txn_id`):
its staging areas, committed file names and claims carry that name.
"""

from __future__ import annotations

import re

from airflow_sparkpoint.checkpoints.bounded import Limits, check_writable
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage.base import PrefixedStorage, Storage

__all__ = ["CHK_RE", "COMMITTED", "CONTROL", "COUNTERS", "CUTOVER", "CUTOVER_PARTS", "CUTOVER_RE", "FOLLOW",
           "GC", "GC_RE", "GENERATIONS", "GENERATIONS_LISTED",
           "ID_FLOOR", "JOB_RE", "LAUNCHES", "LINEAGE", "LINEAGE_RE", "METADATA", "PINS", "RECORD_MAX_BYTES",
           "RECORD_MAX_COST", "RESULTS", "SAVEPOINTS", "SAVEPOINT_RE", "SHARED", "SNAPSHOT_LOG_MAX_BYTES",
           "STATUS", "STATUS_DIR", "TXN", "TXN_ID_RE", "TXN_RE", "VERIFICATION", "JobStore",
           "check_metadata_size", "checkpoint_dir", "checkpoint_metadata", "cutover_key", "gc_key",
           "generation_key",
           "generation_of", "is_job_dir", "launch_key", "limits_of", "lineage_key", "max_bytes_of",
           "parse_pin_dir",
           "parse_txn_id", "pin_dir", "savepoint_checkpoint", "savepoint_dir", "status_key", "txn_id",
           "txn_key", "validate_job_name"]

METADATA = "_metadata"
#: ``<snapshot dir>/_verification.json``: the last restore drill of that snapshot
VERIFICATION = "_verification.json"
ID_FLOOR = "last-disposed-id"
COUNTERS = "checkpoint-counters.json"
COMMITTED = "committed.json"
CHK_RE = re.compile(r"^chk-(\d+)$")
SAVEPOINT_RE = re.compile(r"^savepoint-(\d+)-([0-9a-z]+)$")
TXN_RE = re.compile(r"^(\d+)-g(\d+)\.json$")
LINEAGE_RE = re.compile(r"^(\d+)\.json$")
GC_RE = re.compile(r"^(\d+)-([0-9a-z]+)\.json$")
JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: ``<job>-b<batch>-g<generation>``; job names may contain ``-``, so the greedy job group
#: backtracks to the fixed-form suffix.
TXN_ID_RE = re.compile(r"^(?P<job>.+)-b(?P<batch>\d+)-g(?P<gen>\d+)$")


def validate_job_name(job: str) -> str:
    """Return `job` if it is a valid pipeline name.

    :raises ConfigError: the name is empty, too long, or has characters other than
        letters, digits, ``_``, ``.`` and ``-`` (it becomes a storage prefix and a Delta app id).
    """
    if not isinstance(job, str) or not JOB_RE.match(job) or ".." in job:
        raise ConfigError(
            f"job name {job!r} is invalid; expected 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return job


def is_job_dir(name: str) -> bool:
    """Whether the top-level directory `name` of a storage root is a job's (its name is a
    valid job name, `validate_job_name`): a scratch or dot directory beside the jobs is not."""
    try:
        validate_job_name(name)
    except ConfigError:
        return False
    return True


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def checkpoint_metadata(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}/{METADATA}"


def savepoint_dir(checkpoint_id: int, suffix: str) -> str:
    return f"savepoints/savepoint-{checkpoint_id}-{suffix}"


def savepoint_checkpoint(name: str) -> int | None:
    """The checkpoint id in a savepoint directory's name (``savepoint-<id>-<suffix>``), or
    None when `name` is not one."""
    match = SAVEPOINT_RE.match(name)
    return int(match.group(1)) if match else None


def generation_key(generation: int) -> str:
    return f"{GENERATIONS}/{generation:012d}"


#: generation claims listed, at most, to find the newest (`generations.newest_generation`)
GENERATIONS_LISTED = 1000


def generation_of(key: str) -> int | None:
    """The generation whose claim is at `key` (``generations/<g>``), or None."""
    name = key.rsplit("/", 1)[-1]
    return int(name) if name.isdigit() else None


def lineage_key(generation: int) -> str:
    return f"{LINEAGE}/{generation:012d}.json"


def pin_dir(generation: int) -> str:
    return f"{PINS}/{generation:012d}"


def parse_pin_dir(key: str) -> int | None:
    """The generation of a pin directory's key (``pins/<generation>``), or None."""
    match = re.match(rf"^{PINS}/(\d{{12}})$", key.rstrip("/"))
    return int(match.group(1)) if match else None


def gc_key(epoch_ms: int, suffix: str) -> str:
    return f"{GC}/{epoch_ms:015d}-{suffix}.json"


def txn_id(job: str, batch_id: int, generation: int) -> str:
    """The id of the sink transaction of batch `batch_id` staged by `generation` of `job`."""
    return f"{job}-b{batch_id}-g{generation}"


def parse_txn_id(name: str) -> tuple[str, int, int] | None:
    """``(job, batch, generation)`` of a transaction id, or None if `name` is not one."""
    match = TXN_ID_RE.match(name)
    if not match:
        return None
    return match.group("job"), int(match.group("batch")), int(match.group("gen"))


def txn_key(batch_id: int, generation: int) -> str:
    return f"txn/{batch_id:012d}-g{generation:06d}.json"


STATUS = "status.json"
STATUS_DIR = "status"
#: a shadow run's progress behind blue (`checkpoints.follow_record`), in the shadow's own root
FOLLOW = "follow.json"


#: the records of one cutover, in the order they are written (`checkpoints.cutover`)
CUTOVER_PARTS = ("plan", "green", "agreed", "decision", "claimed", "done", "rollback")
#: ``<13-digit epoch ms>-<8 hex>.<part>.json`` (a cutover id is made like a control request id)
CUTOVER_RE = re.compile(r"^(\d{13}-[0-9a-f]{8})\.(plan|green|agreed|decision|claimed|done|rollback)\.json$")


def cutover_key(cutover_id: str, part: str) -> str:
    """The key of record `part` (one of `CUTOVER_PARTS`) of cutover `cutover_id`.

    :raises ConfigError: `part` is not a cutover record, or the id is malformed.
    """
    key = f"{CUTOVER}/{cutover_id}.{part}.json"
    if part not in CUTOVER_PARTS or not CUTOVER_RE.match(key.rsplit("/", 1)[-1]):
        raise ConfigError(f"cutover record {cutover_id!r}.{part} is invalid; expected an id "
                          "'<13 digits>-<8 hex>' and one of " + ", ".join(CUTOVER_PARTS))
    return key


def status_key(generation: int) -> str:
    return f"{STATUS_DIR}/{generation:012d}.json"


#: a submit token (`services.runs.new_token`: 32 hex digits; up to 64 word characters accepted)
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def launch_key(token: str) -> str:
    """The key of the launch record of the submit with token `token`.

    :raises ConfigError: the token is not 1-64 letters, digits, ``_`` or ``-``.
    """
    if not isinstance(token, str) or not _TOKEN_RE.match(token):
        raise ConfigError(f"submit token {token!r} is invalid; expected 1-64 letters, digits, '_' or '-'")
    return f"{LAUNCHES}/{token}.json"


SHARED = "shared"
SAVEPOINTS = "savepoints"
GENERATIONS = "generations"
LINEAGE = "lineage"
PINS = "pins"
GC = "gc"
TXN = "txn"
CONTROL = "control"
CUTOVER = "cutover"
RESULTS = "results"
LAUNCHES = "launches"

_KIB, _MIB = 1024, 1024 * 1024
#: the largest object of each kind of record (by its first key segment; ``_metadata`` and
#: ``_verification.json`` by their name) a reader accepts; beyond it the record is corrupt
#: (`ObjectTooLarge`, `CorruptRecord`), and writers refuse to write one (`limits_of`,
#: `bounded.check_writable`). Each is sized to what Sparkpoint's writers produce, and with
#: `RECORD_MAX_COST` so that the largest record parses within a reader's memory target
#: (256 MiB above its baseline, `benchmarks/bench_reader_memory.py`).
RECORD_MAX_BYTES = {
    # Lists every file of a snapshot, ~240 bytes of JSON each, and the transactions still
    # pending: 24 MiB is ~100,000 files (a big job has tens of thousands). The coordinator
    # fails a checkpoint that would be larger (`check_metadata_size`), never completes it.
    METADATA: 24 * _MIB,
    VERIFICATION: 64 * _KIB,  # counts per check and an error clipped to 16 KiB
    STATUS: 64 * _KIB,  # a dozen fields and an error clipped to 16 KiB
    STATUS_DIR: 64 * _KIB,
    FOLLOW: 64 * _KIB,  # a dozen fields, a difference clipped to 16 KiB
    COUNTERS: 512 * _KIB,  # at most RECENT_LIMIT outcomes and TREND_LIMIT points (~40 KiB)
    COMMITTED: 64 * _KIB,
    GENERATIONS: 64 * _KIB,  # the driver's details: settings, plan, Airflow try (~2 KiB)
    RESULTS: 256 * _KIB,  # the newest 1,000 committed batch ids and ranges (~30 KiB)
    LAUNCHES: 64 * _KIB,  # a token, a time and where the driver runs (~1 KiB)
    LINEAGE: 64 * _KIB,
    GC: 16 * _MIB,  # one entry lists at most JOURNAL_KEYS_PER_ENTRY shared keys (~5 MiB)
    TXN: 16 * _MIB,  # lists a batch's staged files (S3: each upload's part ETags)
    CONTROL: 64 * _KIB,
    CUTOVER: 64 * _KIB,  # a plan: ids, URIs, bounds, who asked (~2 KiB); reasons clipped to 16 KiB
    ID_FLOOR: 1 * _KIB,
}
#: the most memory the parse of each kind of record may take (`bounded.parse_cost`, an
#: upper bound estimated before parsing); a snapshot's files parse to ~6.5 times their JSON
#: (`_metadata`: its bytes and its parse together stay under 200 MiB)
RECORD_MAX_COST = {
    METADATA: 160 * _MIB,
    VERIFICATION: 1 * _MIB,
    STATUS: 1 * _MIB,
    STATUS_DIR: 1 * _MIB,
    FOLLOW: 1 * _MIB,
    COUNTERS: 8 * _MIB,
    COMMITTED: 1 * _MIB,
    GENERATIONS: 1 * _MIB,
    RESULTS: 2 * _MIB,  # a reader holds the newest GENERATIONS_SHOWN (20) of them
    LAUNCHES: 1 * _MIB,
    LINEAGE: 1 * _MIB,
    GC: 160 * _MIB,
    TXN: 160 * _MIB,
    CONTROL: 1 * _MIB,
    CUTOVER: 1 * _MIB,
    ID_FLOOR: 64 * _KIB,
}
#: a file of a snapshot that restore-time checks read from the store (the offset log entry
#: of the restart batch): one line per source, ~30 bytes per Kafka partition; the same
#: limit for a Spark log file read whole in a live location (`runtime.livedir.read_log_file`)
SNAPSHOT_LOG_MAX_BYTES = 4 * _MIB


def _kind(key: str) -> str | None:
    parts = key.strip("/").split("/")
    if parts[-1] in (METADATA, VERIFICATION):
        return parts[-1]
    if parts[0] in (SHARED, SAVEPOINTS, PINS) or CHK_RE.match(parts[0]):
        return None
    return parts[0] if parts[0] in RECORD_MAX_BYTES else None


def max_bytes_of(key: str) -> int | None:
    """The size limit of the record at `key` (relative to the job root); None for the
    files of snapshots (state, offsets: read streamed, never parsed whole)."""
    kind = _kind(key)
    return None if kind is None else RECORD_MAX_BYTES[kind]


def limits_of(key: str) -> Limits:
    """The limits of the record at `key` (relative to the job root), read and written
    (`bounded.read_record`, `bounded.check_writable`).

    :raises ValueError: `key` is not a record's (a snapshot's file, an unknown name).
    """
    kind = _kind(key)
    if kind is None:
        raise ValueError(f"{key!r} is not the key of a record of a job")
    return Limits(RECORD_MAX_BYTES[kind], RECORD_MAX_COST[kind])


def check_metadata_size(data: bytes, where: str) -> None:
    """Refuse to write a ``_metadata`` that no reader would accept.

    :raises CatalogError: `data` is over the ``_metadata`` limits (the snapshot is not
        completed: a failed checkpoint, never an unreadable completed one).
    """
    check_writable(data, limits_of(METADATA), where, "the snapshot is not completed "
                                                     "(too many files referenced)")


class JobStore(PrefixedStorage):
    """A job's keys (``<root>/<job>/``): every `get` is bounded by the limit of its kind
    of record (`max_bytes_of`) unless the caller gives one, so no reader of a job's
    records can be made to read a planted multi-GB object whole."""

    def __init__(self, storage: Storage, job: str) -> None:
        super().__init__(storage, job)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return super().get(key, max_bytes if max_bytes is not None else max_bytes_of(key))
