"""Where things live under ``<dir>/<job>/`` (in the spirit of Flink's layout).

::

    <job>/chk-<id>/_metadata                      completed checkpoint (written last)
    <job>/shared/<path>~<sha16>                  files shared by checkpoints (content-addressed)
    <job>/savepoints/savepoint-<id>-<suffix>/_metadata, files/<path>
    <job>/generations/<generation>                one object per job start (atomic create)
    <job>/lineage/<generation>.json               what that generation started from (its origin)
    <job>/gc/<epoch-ms>-<suffix>.json             journal of shared files retention is deleting
    <job>/txn/<batch>-g<generation>.json          sink pre-commit records
    <job>/status.json                             heartbeat and state of the current run
    <job>/control/<request-id>.{request,ack,result}.json
    <job>/last-disposed-id                        highest id ever disposed (ids are never reused)

A sink transaction is named ``<job>-b<batch>-g<generation>`` (`txn_id`, `parse_txn_id`):
its staging areas, committed file names and claims carry that name.
"""

from __future__ import annotations

import re

from airflow_sparkpoint.exceptions import ConfigError

METADATA = "_metadata"
ID_FLOOR = "last-disposed-id"
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


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def checkpoint_metadata(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}/{METADATA}"


def savepoint_dir(checkpoint_id: int, suffix: str) -> str:
    return f"savepoints/savepoint-{checkpoint_id}-{suffix}"


def generation_key(generation: int) -> str:
    return f"generations/{generation:012d}"


def lineage_key(generation: int) -> str:
    return f"{LINEAGE}/{generation:012d}.json"


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
SHARED = "shared"
SAVEPOINTS = "savepoints"
GENERATIONS = "generations"
LINEAGE = "lineage"
GC = "gc"
TXN = "txn"
CONTROL = "control"
