"""Which transaction committed batch N of a job to a Delta table, and the decision that
keeps a commit and an abort of one transaction apart (`DeltaSink`).

*Between transactions* the table's app-transaction version is the arbiter: every commit
carries ``Transaction(app_id=<job>, version=<batch>)``, and delta-rs fails a commit whose
snapshot is older than a concurrent commit of the same app id (``ConcurrentTransaction``),
so of two transactions of batch N at most one lands. A commit into a table that did not
exist when it looked has no snapshot to conflict with: it is a create that fails when
the table exists (version 0 is a conditional put), after which the committer reads the
table again and settles as below. *Which* one landed is read from the
commit's custom metadata (``sparkpoint.batch``, ``sparkpoint.generation``,
``sparkpoint.txn``) in the table's history, newest first, skipping commits that a later
``RESTORE`` undid (``restore.sinkAhead=rewind``).

*Within one transaction*, commit and abort race when a stalled driver (a zombie) commits
while the newer generation's recovery aborts it: the abort deletes the staged files, and
an append committed after that would reference files that are gone. A decision object
``<table>/_sparkpoint/decisions/<job>/<txn>.json`` (promote | abort, created with
put_if_absent by `_claims.decide` at `_claims.decision_key`, like the file sinks')
settles it: the committer decides promote before its Delta commit, the aborter decides abort before deleting
anything;
whoever is second defers to the first. An aborter that finds promote, with the batch not
landed, commits the transaction for its stalled or dead committer (it is decided); if the
batch was landed by this transaction once and a rewind undid it, the data is garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, TransactionRecord
from airflow_sparkpoint.exceptions import SinkAheadError, SinkError
from airflow_sparkpoint.sinks._delta_location import STAGING
from airflow_sparkpoint.sinks.base import replay_of
from airflow_sparkpoint.storage.paths import confine

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

REPLAY = "sparkpoint.replay"
#: the custom commit info of Sparkpoint's Delta commits (`commit_info`), read back by
#: every reader of the table's history (`sparkpoint_commit`)
JOB_KEY = "sparkpoint.job"
BATCH_KEY = "sparkpoint.batch"
GENERATION_KEY = "sparkpoint.generation"
TXN_KEY = "sparkpoint.txn"
_FIRST_PAGE = 16
_UNKNOWN = object()


def job_staging(job: str) -> str:
    """Where `job`'s transactions stage their files, relative to the table root."""
    return f"{STAGING}/{job}"


def staging_dir(job: str, txn: str) -> str:
    """The staging area of transaction `txn` of `job`, relative to the table root."""
    return f"{job_staging(job)}/{txn}"


def sparkpoint_commit(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The Sparkpoint keys of a Delta history `entry` (`commit_info`) as values: ``job``,
    ``batch`` and ``generation`` (None when the commit is not Sparkpoint's)."""
    batch, generation = entry.get(BATCH_KEY), entry.get(GENERATION_KEY)
    return {"job": entry.get(JOB_KEY), "batch": int(batch) if batch is not None else None,
            "generation": int(generation) if generation is not None else None}


def staged(record: TransactionRecord) -> dict[str, Any]:
    """The staged batch `record` describes (``payload.staged``), its staging area and every
    file confined to the transaction's own staging area ``_sparkpoint_txn/<job>/<txn>/``:
    a record is read from the store, and a commit adds its files to the table, a merge
    reads them and an abort deletes the area, so none may name anything else (another
    transaction's staging, the table's data, another table).

    :raises SinkError: the payload is malformed, or names another staging area or a file
        outside it (the message names the path).
    """
    what = f"transaction {record.txn_id} payload.staged"
    try:
        batch = dict(record.payload["staged"])
        files = [dict(f) for f in batch["files"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SinkError(f"{what} is malformed ({exc!r}); expected the staged files of a DeltaSink") from None
    own = staging_dir(record.job, record.txn_id)
    if batch.get("staging") != own:
        raise SinkError(f"{what}.staging {batch.get('staging')!r} is not the transaction's own staging area "
                        f"{own!r}; refused")
    for file in files:
        file["path"] = confine(file.get("path"), under=own, what=f"{what}.files[].path", error=SinkError,
                               exact=True)
    return {**batch, "files": files}


def commit_info(record: TransactionRecord) -> dict[str, str]:
    """The custom commit info of `record`'s Delta commit: its transaction key and, when
    the runtime captured one, how to replay the batch (``sparkpoint.replay``,
    `airflow_sparkpoint.runtime.replay`)."""
    info = {
        JOB_KEY: record.job,
        BATCH_KEY: str(record.batch_id),
        GENERATION_KEY: str(record.generation),
        TXN_KEY: record.txn_id,
    }
    replay = replay_of(record)
    if replay is not None:
        info[REPLAY] = replay
    return info


def replay_in(entry: Mapping[str, Any] | None) -> str | None:
    """The replay record in a commit's info (None: no commit, or a commit without one)."""
    replay = entry.get(REPLAY) if entry is not None else None
    return replay if isinstance(replay, str) else None


def _scan(history: Sequence[Mapping[str, Any]], job: str, batch: int) -> Any:
    """The effective commit of (`job`, `batch`) in `history` (newest first); None when it
    certainly has none; `_UNKNOWN` when the entries do not tell (look further back, or a
    RESTORE to a timestamp hides what it undid)."""
    ceiling: int | None = None  # commits above this version were undone by a RESTORE
    for entry in history:
        version = int(entry.get("version", -1))
        if entry.get("operation") == "RESTORE":
            target = (entry.get("operationParameters") or {}).get("version")
            if target is None:
                return _UNKNOWN
            ceiling = int(target) if ceiling is None else min(ceiling, int(target))
            continue
        if ceiling is not None and version > ceiling:
            continue
        if entry.get(JOB_KEY) != job or entry.get(BATCH_KEY) is None:
            continue
        committed = int(entry[BATCH_KEY])
        if committed == batch:
            return dict(entry)
        if committed < batch:
            return None  # a job's effective commits are in batch order
    return _UNKNOWN


def batch_commit(table: DeltaTable, job: str, batch: int) -> dict[str, Any] | None:
    """The commit info of the commit of batch `batch` of `job` that is in effect, or None
    when the history does not have one (never committed, or log entries cleaned up)."""
    limit = _FIRST_PAGE
    while True:
        history = table.history(limit)
        found = _scan(history, job, batch)
        if found is not _UNKNOWN:
            return found  # type: ignore[no-any-return]
        if len(history) < limit:
            return None
        limit *= 8


def batch_files(table: DeltaTable, job: str, batch: int) -> list[str] | None:
    """URIs of the data files the commit of batch `batch` of `job` in effect added (the
    files of its version that the version before did not have; a merge's rewritten files
    included), or None when the batch has no commit. Loads older versions of `table`."""
    entry = batch_commit(table, job, batch)
    if entry is None:
        return None
    version = int(entry["version"])
    table.load_as_version(version)
    after = set(table.file_uris())
    before: set[str] = set()
    if version > 0:
        table.load_as_version(version - 1)
        before = set(table.file_uris())
    return sorted(after - before)


def lineage_commit(history: Sequence[Mapping[str, Any]], job: str, batch: int, generation: int) -> int | None:
    """The table version of the commit of batch `batch` of `job` by `generation` in
    `history` (newest first), whether a later ``RESTORE`` undid it or not (a rewind to
    that lineage restores the table to it); None when the history has none."""
    for entry in history:
        if (entry.get("operation") != "RESTORE" and entry.get(JOB_KEY) == job
                and entry.get(BATCH_KEY) == str(batch)
                and entry.get(GENERATION_KEY) == str(generation)):
            return int(entry["version"])
    return None


def first_commit(history: Sequence[Mapping[str, Any]], job: str) -> int | None:
    """The table version of the oldest commit of `job` in `history` (newest first)."""
    versions = [int(e["version"]) for e in history
                if e.get("operation") != "RESTORE" and e.get(JOB_KEY) == job and "version" in e]
    return min(versions) if versions else None


def rewind_target(history: Sequence[Mapping[str, Any]], job: str, snapshot: SnapshotMetadata, sink_id: str,
                  where: str) -> tuple[int, int]:
    """``(table version, last committed batch)`` a rewind of the table at `where` (whose
    `history`, newest first, is given) to `snapshot` restores (`DeltaSink.rewind`).

    :raises SinkAheadError: the history holds no such version.
    """
    owners = snapshot.batch_owners
    if owners.ranges:
        # The lineage's newest batch with a commit in the history: a pending one may have
        # been committed after the snapshot (then undone by another lineage's rewind).
        pending = {t.batch_id: t.generation for t in snapshot.transactions if t.job == job}
        for batch in range(snapshot.batch_id, -1, -1):
            generation = pending.get(batch, owners.of(batch))
            if generation is None:
                continue
            version = lineage_commit(history, job, batch, generation)
            if version is not None:
                return version, batch
            if batch not in pending:
                raise SinkAheadError(
                    f"cannot rewind {where}: its history has no commit of batch {batch} of job {job!r} by "
                    f"generation {generation}, the lineage of {snapshot.kind} "
                    f"{snapshot.id} (its log may have been "
                    "cleaned up)"
                )
        first = first_commit(history, job)
        if first is None or first == 0:
            raise SinkAheadError(
                f"cannot rewind {where} to before the first commit of job {job!r} "
                + ("(no commit of the job is in its history)" if first is None
                   else "(the table was created by it)")
            )
        return first - 1, -1
    for entry in history:  # newest first
        if (entry.get(JOB_KEY) == job and entry.get(BATCH_KEY) == str(snapshot.batch_id)
                and entry.get("operation") != "RESTORE"):
            return int(entry["version"]), snapshot.batch_id
    position = snapshot.sink_positions.get(sink_id)
    if not isinstance(position, Mapping) or "version" not in position:
        raise SinkAheadError(
            f"cannot rewind {where}: snapshot {snapshot.kind} {snapshot.id} recorded no table version "
            f"and the table has no commit of batch {snapshot.batch_id} of job {job!r}"
        )
    return int(position["version"]), int(position.get("batch", -1))


def table_paths(table: DeltaTable) -> set[str]:
    """Paths of the table's files as staged (the log holds them percent-encoded)."""
    import urllib.parse

    import pyarrow as pa

    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return {urllib.parse.unquote(p) for p in paths}


def ever_committed(table: DeltaTable, record: TransactionRecord) -> bool:
    """Whether the history holds a commit of `record` (in effect or undone by a rewind)."""
    for entry in table.history():
        if (entry.get(JOB_KEY) == record.job
                and entry.get(BATCH_KEY) == str(record.batch_id)
                and entry.get(GENERATION_KEY) == str(record.generation)):
            return True
    return False
