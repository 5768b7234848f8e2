"""Exclusive promotion per batch for the file sinks (`S3Sink`, `DirectorySink`): the claim
protocol (invariant 8). Storage-level: it needs only `Storage.put_if_absent` (S3
``If-None-Match: *``, a local hard link), `put`, `get` and `delete`.

Two kinds of small JSON objects under the destination (the leading ``_`` hides them from
Spark's and Hadoop's readers)::

    _sparkpoint/manifests/<job>/<batch>.json   CLAIM of batch N: the one transaction that
                                               promotes N, and what it makes visible
    _sparkpoint/decisions/<job>/<txn>.json     DECISION of one transaction: promote | abort
    _sparkpoint/claimed/<job>/<10^19-1-N>      MARKER of batch N, written before its claim:
                                               the newest one tells the committed position
                                               without listing every claim (older ones are
                                               deleted in steps; `_manifests`)

Commit of transaction T (batch N)::

    1. claim(N) exists?  names T: finish it (below).  names U: T lost (step 5).
    2. decision(T) := promote, with T's promotion plan   (put_if_absent; the winner stands)
       the decision is abort: T was aborted, nothing of it may become visible -> SinkError
    3. marker(N); claim(N) := T, state "promoting", plan + files   (put_if_absent, BEFORE any file is visible)
       it names U: T lost (step 5)
    4. finish: promote every file of the plan (idempotent), then rewrite claim(N) with
       state "done" (only T's promoters write a claim that names T)
    5. T lost to U: T's own staged data is discarded, `TransactionConflict` is raised

Abort of T (batch N)::

    1. claim(N) names T: T is committed; finish it if unfinished, and refuse (SinkError)
    2. decision(T) := abort                              (put_if_absent)
       won: discard T's staged data (and any file of T already visible: only a commit
            of the previous release, which promoted before its manifest, leaves one)
       promote had won (T's committer passed step 2): help it: claim(N) := T from the
            decision's plan; if that (or an earlier claim) names T, T is committed: finish
            and refuse; if claim(N) names U, T lost: discard T's staged data

Semantics:

* ``is_committed(T)`` iff claim(N) names T. A claim is written only after decision(T) =
  promote, and the decision is final, so a claim is never void and never released:
  ``committed_position`` counts claims, and an unfinished claim ("promoting") is finished
  by whoever meets it (`commit`, `abort`, `cleanup_orphans`), never aborted.
* Manifests of the previous release (no ``state``, written after promotion) count as done.

Why it is exclusive and loses nothing:

* Two transactions of batch N: both may decide promote, but claim(N) is one
  put_if_absent, so exactly one claims; files become visible only after the claim (step
  4 follows step 3), so the loser has made nothing visible, and its staged data is
  discarded by itself (step 5) or by whoever aborts or cleans it up later.
* Commit against abort of the same T (a stalled zombie against the newer generation's
  recovery): decision(T) is one put_if_absent. If abort won, T never claims (step 2
  fails first), so its discarded data is never needed, and batch N stays free for the
  re-run. If promote won, no aborter ever deletes T's data while T can still claim: it
  helps T claim instead, so T either holds N (it is committed: the abort is refused) or
  lost N for good (claims are permanent) and then its data is garbage.
* Hence the claimant whose staged data is gone — the newer generation's recovery
  aborted T, then T's stalled committer woke — never claims: its step 2 finds the abort
  decision. A claim whose data was deleted by a Sparkpoint abort cannot exist, so no
  claim ever needs releasing, and the legitimate re-run of the batch always finds it
  free or held by a transaction that can finish. A claim can only be stuck if its data
  was deleted outside Sparkpoint (an S3 lifecycle rule expiring pending uploads, a
  manual delete): `finish` raises `SinkError` ("output is lost") and the batch must be
  produced again. Only a person may then release the claim (delete the object, after
  checking that no file it names is visible and none of its staged data is left, so it
  can never finish): nothing can tell automatically that deleted data is not coming back.
* A claimant that dies halfway (any step) is rolled forward from the claim object alone
  (it holds the plan): by the next `commit` of T (recovery, the commit step), by an
  `abort` of T, or by `cleanup_orphans` when T's record is already gone.

Readers: promoting several files is not atomic for a directory listing (files appear one
by one). Readers that need whole batches list the files of finished claims
(`committed_files`) instead of listing the directory.
"""

from __future__ import annotations

import abc
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import (
    CommitOutcomeUnknown,
    ObjectExists,
    SinkError,
    StorageError,
    TransactionConflict,
)
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.base import CommitOutcome, CommittedTxn, Sink, replay_of
from airflow_sparkpoint.storage import Storage

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

CLAIM_SCHEMA_VERSION = 2
DECISION_SCHEMA_VERSION = 1
DECISIONS = "_sparkpoint/decisions"
PROMOTE, ABORT = "promote", "abort"
PROMOTING, DONE = "promoting", "done"


class FileSink(Sink):
    """What `S3Sink` and `DirectorySink` share: the identity and connection options of the
    destination, the readers of its claims, and (abstract) what the protocol needs."""

    uri: str
    format: str
    #: S3 connection options from `configure` (`_manifests.options_from`)
    _options: dict[str, Any]
    _store: Storage | None

    @property
    def sink_id(self) -> str:
        return self.uri

    @property
    def location_uri(self) -> str:
        return self.uri  # already ``file:///abs`` or ``s3://bucket/prefix``

    def configure(self, storage_options: Mapping[str, Any]) -> None:
        options = manifests.options_from(storage_options)
        if options != self._options:
            self._options = options
            self._store = None

    def is_committed(self, record: TransactionRecord) -> bool:
        return is_committed(self._storage(), record)

    def decision(self, record: TransactionRecord) -> str | None:
        return decided(self._storage(), record)

    def committed_position(self, job: str) -> int | None:
        return manifests.committed_position(self._storage(), job)

    def committed_txn(self, job: str, batch_id: int) -> CommittedTxn | None:
        return committed_txn(self._storage(), job, batch_id)

    def replay_record(self, job: str, batch_id: int) -> str | None:
        return replay_record(self._storage(), job, batch_id)

    def committed_files(self, job: str, *, upto_batch: int | None = None) -> list[str]:
        """URIs of every file of `job`'s batches whose promotion is done (up to
        `upto_batch`), in batch order: a whole-batch view for readers, where a listing of
        the destination may show a batch whose files are still being promoted.

        Spark reads an `S3Sink`'s with ``spark.read.parquet(*uris)`` (``s3a://`` instead of
        ``s3://`` with hadoop-aws), a `DirectorySink`'s with
        ``spark.read.option("basePath", sink.uri).format(fmt).load(*uris)`` (``basePath``
        keeps the partition columns of ``partition_by``).

        :raises SinkError: a claim names a file outside the destination.
        """
        found = []
        for claim in committed_batches(self._storage(), job):
            if claim["state"] == DONE and (upto_batch is None or int(claim["batch_id"]) <= upto_batch):
                found += [self._file_uri(f) for f in claim.get("files", ())]
        return found

    def batch_files(self, job: str, batch_id: int) -> list[str] | None:
        """URIs of the files of batch `batch_id` of `job` once its promotion is done, or
        None (not committed, or still promoting): what a shadow's comparison reads
        (`runtime.follow_compare`).

        :raises SinkError: the claim is unreadable or names a file outside the destination.
        """
        claim = manifests.read_manifest(self._storage(), job, batch_id)
        if claim is None or claim.get("state") != DONE:
            return None
        return [self._file_uri(f) for f in claim.get("files", ())]

    # -- what the protocol needs ---------------------------------------------------------

    @abc.abstractmethod
    def _storage(self) -> Storage:
        """The destination as a `Storage` (claims, decisions, listings)."""

    @abc.abstractmethod
    def _file_uri(self, file: Mapping[str, Any]) -> str:
        """The URI of one file a claim names (an item of its ``files``), confined to the
        destination (a claim is read from the output location: readers are never pointed
        outside it).

        :raises SinkError: the file's path is malformed or outside the destination.
        """

    @abc.abstractmethod
    def _plan(self, record: TransactionRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``(plan, files)``: how to promote the staged data (enough to finish without the
        record) and the files that become visible."""

    @abc.abstractmethod
    def _missing(self, txn: str, plan: Mapping[str, Any]) -> list[str]:
        """Items of `txn`'s `plan` whose staged data is gone and whose file is not in place (a
        cheap listing, before the claim: a batch already lost is not claimed)."""

    @abc.abstractmethod
    def _promote(self, claim: Mapping[str, Any]) -> list[str]:
        """Make every file of the claim's plan visible, idempotently; one state per file.

        :raises SinkError: staged data is gone and its file is not in place (lost).
        """

    @abc.abstractmethod
    def _discard(self, txn: str, plan: Mapping[str, Any] | None, *, promoted_too: bool) -> int:
        """Delete the staged data of `txn` (the plan's and any other); with `promoted_too`
        also any visible file of it. Returns how many staged items were removed."""

    @abc.abstractmethod
    def _after_done(self, claim: Mapping[str, Any]) -> None:
        """Clean up after a finished promotion (e.g. the empty staging area)."""


# -- objects ---------------------------------------------------------------------------


def decision_key(job: str, txn: str) -> str:
    """Where the promote/abort decision of transaction `txn` lives (every sink's, Delta's too)."""
    return f"{DECISIONS}/{job}/{txn}.json"


def _dumps(body: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(body), sort_keys=True).encode()


def decide(store: Storage, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create the decision `body` at `key` unless one exists; return the one that stands.

    :raises StorageError: the store failed (the decision may or may not be written).
    """
    try:
        store.put_if_absent(key, _dumps(body))
        return dict(body)
    except ObjectExists:
        existing = manifests.read_record(store, key)
        if existing is None:  # decisions are never deleted
            raise StorageError(f"{store.uri}/{key} exists and does not: the store is inconsistent") from None
        return existing


def decided(store: Storage, record: TransactionRecord) -> str | None:
    """The decision that stands for `record` (``promote`` or ``abort``), or None; reads only.

    :raises SinkError: the decision object is unreadable.
    """
    found = manifests.read_record(store, decision_key(record.job, record.txn_id))
    return None if found is None else str(found.get("decision"))


def decision_body(record: TransactionRecord, decision: str) -> dict[str, Any]:
    """The DECISION object of `record` (the file sinks add the promotion plan; Delta uses it as is)."""
    return {
        "schema_version": DECISION_SCHEMA_VERSION,
        "decision": decision,
        "job": record.job,
        "batch_id": record.batch_id,
        "generation": record.generation,
        "txn_id": record.txn_id,
        "decided_at": time.time(),
    }


def _decision(record: TransactionRecord, decision: str, plan: Mapping[str, Any] | None,
              files: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    body = decision_body(record, decision)
    if decision == PROMOTE:
        body["plan"] = dict(plan or {})
        body["files"] = [dict(f) for f in files or ()]
        replay = replay_of(record)
        if replay is not None:  # kept by the claim: how to replay the batch (runtime.replay)
            body["replay"] = replay
    return body


def _claim(sink: FileSink, decision: Mapping[str, Any]) -> dict[str, Any]:
    files = [dict(f) for f in decision.get("files", ())]
    extra = {"replay": decision["replay"]} if isinstance(decision.get("replay"), str) else {}
    return {
        **extra,
        "schema_version": CLAIM_SCHEMA_VERSION,
        "state": PROMOTING,
        "job": decision["job"],
        "batch_id": decision["batch_id"],
        "generation": decision["generation"],
        "txn_id": decision["txn_id"],
        "sink_id": sink.sink_id,
        "format": sink.format,
        "files": files,
        "bytes": sum(int(f.get("size", 0)) for f in files),
        "plan": dict(decision.get("plan", {})),
        "claimed_at": time.time(),
    }


def state_of(claim: Mapping[str, Any]) -> str:
    """``promoting`` or ``done``; a manifest of the previous release (no state) is done."""
    return str(claim.get("state", DONE))


def _take(store: Storage, sink: FileSink, decision: Mapping[str, Any]) -> dict[str, Any]:
    """Write the claim of `decision`'s batch for its transaction unless the batch is
    claimed; return the claim that stands."""
    job, batch = str(decision["job"]), int(decision["batch_id"])
    body = _claim(sink, decision)
    store.put(manifests.marker_key(job, batch), b"")  # before the claim: `committed_position`
    try:
        store.put_if_absent(manifests.manifest_key(job, batch), _dumps(body))
    except ObjectExists:
        existing = manifests.read_manifest(store, job, batch)
        if existing is None:  # claims are never deleted
            raise StorageError(f"the claim of batch {batch} of {job!r} in "
                               f"{store.uri} exists and does not") from None
        return existing
    stale = manifests.stale_markers(job, batch)
    if stale:
        try:
            store.delete(stale)
        except (StorageError, OSError) as exc:  # left behind (empty objects): the claim stands
            log.warning("could not delete %d stale claim markers of %s in %s: %s", len(stale), job,
                        store.uri, exc)
    return body


# -- the protocol ----------------------------------------------------------------------


def _conflict(sink: FileSink, record: TransactionRecord, winner: Mapping[str, Any]) -> TransactionConflict:
    return TransactionConflict(
        f"batch {record.batch_id} of job {record.job!r} was already committed to {sink.uri} by transaction "
        f"{winner.get('txn_id')!r} (generation {winner.get('generation')}); transaction {record.txn_id!r} "
        f"(generation {record.generation}) lost the batch and its staged data was discarded (it would "
        "duplicate the batch)"
    )


def commit(sink: FileSink, record: TransactionRecord) -> CommitOutcome:
    """Commit `record` through its batch's claim (see the module docstring).

    :raises TransactionConflict: another transaction holds the batch; this one's staged
        data was discarded.
    :raises SinkError: the transaction was aborted, or its staged data is lost.
    :raises CommitOutcomeUnknown: the store failed midway; run the commit again.
    """
    store = sink._storage()
    try:
        claim = manifests.read_manifest(store, record.job, record.batch_id)
        if claim is not None:
            if claim.get("txn_id") == record.txn_id:
                return _finish(sink, claim)
            _lose(sink, record, claim)
        faults.pause("before_claim", record.batch_id, txn=record.txn_id)
        plan, files = sink._plan(record)
        missing = sink._missing(record.txn_id, plan)
        if missing:
            decision = manifests.read_record(store, decision_key(record.job, record.txn_id))
            if decision is not None and decision.get("decision") == ABORT:
                _aborted(sink, record)
            raise SinkError(
                f"the staged data of {record.txn_id} is gone and not in place in "
                f"{sink.uri} (e.g. {missing[0]}; "
                f"{len(missing)} item(s)): this batch's output is lost, nothing was claimed; restore from an "
                "earlier checkpoint so that the batch is produced again"
            )
        decision = decide(store, decision_key(record.job, record.txn_id),
                          _decision(record, PROMOTE, plan, files))
        if decision.get("decision") != PROMOTE:
            _aborted(sink, record)
        claim = _take(store, sink, decision)
        if claim.get("txn_id") != record.txn_id:
            _lose(sink, record, claim)
        faults.pause("claimed", record.batch_id, txn=record.txn_id)
        return _finish(sink, claim)
    except (StorageError, OSError) as exc:
        raise CommitOutcomeUnknown(
            f"commit of {record.txn_id} to {sink.uri} was interrupted ({exc}); the staged data is kept, "
            "run the commit again"
        ) from None


def _aborted(sink: FileSink, record: TransactionRecord) -> None:
    """`record` was decided abort: raise (a conflict if another transaction holds the batch)."""
    store = sink._storage()
    winner = manifests.read_manifest(store, record.job, record.batch_id)
    if winner is not None and winner.get("txn_id") != record.txn_id:
        _lose(sink, record, winner)
    raise SinkError(
        f"transaction {record.txn_id} was aborted (decision at "
        f"{store.uri}/{decision_key(record.job, record.txn_id)}), "
        f"so its staged data may be gone; it cannot be committed to {sink.uri}. Batch "
        f"{record.batch_id} is produced "
        "again by the run that aborted it"
    )


def _finish(sink: FileSink, claim: Mapping[str, Any]) -> CommitOutcome:
    """Promote what `claim` names if it is not done yet, then mark it done (idempotent)."""
    txn, batch = str(claim.get("txn_id")), int(claim.get("batch_id", -1))
    files = list(claim.get("files", ()))
    detail = {"files": len(files), "bytes": sum(int(f.get("size", 0)) for f in files)}
    if state_of(claim) == DONE:
        sink._after_done(claim)
        return CommitOutcome(txn, "already", detail)
    if "plan" not in claim:
        raise SinkError(f"the claim of batch {batch} in {sink.uri} has no promotion plan; expected a claim "
                        "written by this release")
    states = sink._promote(claim)
    faults.pause("promoted", batch, txn=txn)
    done = {**claim, "state": DONE, "done_at": time.time()}
    sink._storage().put(manifests.manifest_key(str(claim["job"]), batch), _dumps(done))
    sink._after_done(done)
    log.info("committed %s to %s: %d file(s), %d already in place", txn, sink.uri, len(states),
             sum(1 for s in states if s == "already"))
    return CommitOutcome(txn, "committed", detail)


def _lose(sink: FileSink, record: TransactionRecord, winner: Mapping[str, Any]) -> None:
    """`record` lost its batch to `winner`: discard its own staged data and raise."""
    plan, _files = sink._plan(record)
    decision = decide(sink._storage(), decision_key(record.job, record.txn_id),
                      _decision(record, ABORT, None, None))
    # Whether it had decided to promote or not: claims are permanent, so it never will.
    sink._discard(record.txn_id, plan, promoted_too=decision.get("decision") == ABORT)
    log.warning("%s lost batch %d to %s in %s; its staged data was discarded", record.txn_id, record.batch_id,
                winner.get("txn_id"), sink.uri)
    raise _conflict(sink, record, winner)


def settle(sink: FileSink, record: TransactionRecord, plan: Mapping[str, Any] | None, *,
           orphan: bool = False) -> str:
    """Abort `record` unless it holds (or, having decided to promote, can take) its
    batch's claim. Returns ``discarded`` or ``committed`` (finished now if needed).

    :raises StorageError: or `OSError`: the store failed; nothing was concluded.
    """
    store = sink._storage()
    claim = manifests.read_manifest(store, record.job, record.batch_id)
    if claim is not None and claim.get("txn_id") == record.txn_id:
        _finish(sink, claim)
        return "committed"
    decision = decide(store, decision_key(record.job, record.txn_id), _decision(record, ABORT, None, None))
    if decision.get("decision") == PROMOTE:
        # Its committer passed its decision and may be stalled or dead before the claim:
        # take the claim for it. Either it then holds the batch (committed) or lost it.
        claim = claim if claim is not None else _take(store, sink, decision)
        if claim.get("txn_id") == record.txn_id:
            _finish(sink, claim)
            return "committed"
        plan = plan if plan is not None else decision.get("plan")
    # An orphan's files were never looked for outside its staging (no record names them).
    sink._discard(record.txn_id, plan, promoted_too=decision.get("decision") == ABORT and not orphan)
    return "discarded"


def abort(sink: FileSink, record: TransactionRecord) -> None:
    """Abort `record` (see the module docstring).

    :raises SinkError: the transaction is committed (its promotion, if unfinished, was
        finished now); or the store failed.
    """
    plan, _files = sink._plan(record)
    try:
        outcome = settle(sink, record, plan)
    except (StorageError, OSError) as exc:
        raise SinkError(f"cannot abort {record.txn_id} in {sink.uri}: {exc}") from None
    if outcome == "committed":
        raise SinkError(f"transaction {record.txn_id} has committed to {sink.uri}; it cannot be aborted")
    log.info("aborted %s in %s", record.txn_id, sink.uri)


def settle_orphan(sink: FileSink, txn: str, staged: Mapping[str, Any] | None = None) -> str:
    """Settle staged data of `txn` that no record refers to any more (`cleanup_orphans`):
    finish it if it holds its claim (its record was deleted before the promotion was
    done), else discard it (`staged`: what the caller listed of it, as a plan). Returns
    ``committed`` or ``discarded``.

    :raises SinkError: `txn` is not a transaction id, or the store failed.
    """
    parsed = layout.parse_txn_id(txn)
    if parsed is None:
        raise SinkError(f"{txn!r} is not a Sparkpoint transaction id")
    job, batch, generation = parsed
    record = TransactionRecord(job=job, batch_id=batch, generation=generation, sink="", sink_id=sink.sink_id,
                               payload={})
    try:
        return settle(sink, record, staged, orphan=True)
    except (StorageError, OSError) as exc:
        raise SinkError(f"cannot clean up {txn} in {sink.uri}: {exc}") from None


# -- readers ---------------------------------------------------------------------------


def is_committed(store: Storage, record: TransactionRecord) -> bool:
    """Whether `record` holds its batch's claim (committed, its promotion maybe unfinished)."""
    claim = manifests.read_manifest(store, record.job, record.batch_id)
    return claim is not None and claim.get("txn_id") == record.txn_id


def committed_txn(store: Storage, job: str, batch_id: int) -> CommittedTxn | None:
    claim = manifests.read_manifest(store, job, batch_id)
    if claim is None:
        return None
    generation = claim.get("generation")
    return CommittedTxn(job=job, batch_id=batch_id,
                        generation=int(generation) if generation is not None else None,
                        txn_id=str(claim["txn_id"]) if claim.get("txn_id") else None)


def replay_record(store: Storage, job: str, batch_id: int) -> str | None:
    """The replay record the claim of batch `batch_id` keeps (None: no claim, or none kept)."""
    claim = manifests.read_manifest(store, job, batch_id)
    replay = claim.get("replay") if claim is not None else None
    return replay if isinstance(replay, str) else None


def committed_batches(store: Storage, job: str) -> list[dict[str, Any]]:
    """Every claim of `job` in batch order (``batch_id``, ``txn_id``, ``state``, ``files``)."""
    claims = []
    for batch in manifests.claimed_batches(store, job):
        claim = manifests.read_manifest(store, job, batch)
        if claim is not None:
            claims.append({**claim, "state": state_of(claim)})
    return claims


# -- promotion in two halves (fault and pause points) -------------------------------------


def in_halves(pool: Executor | None, fn: Callable[[T], R], items: Sequence[T], batch_id: int,
              txn: str) -> list[R]:
    """``[fn(i) for i in items]`` (on `pool` if given), with the ``promoting`` fault and
    pause points once half of the items are done (after all of them when fewer than 2)."""

    def run(part: Sequence[T]) -> list[R]:
        return list(pool.map(fn, part)) if pool is not None else [fn(i) for i in part]

    half = len(items) // 2 if len(items) >= 2 else len(items)
    results = run(items[:half])
    faults.maybe_kill("promoting", batch_id)
    faults.pause("promoting", batch_id, txn=txn, done=half, total=len(items))
    return results + run(items[half:])
