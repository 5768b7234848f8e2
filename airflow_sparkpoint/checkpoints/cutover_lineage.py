"""Cutovers and lineages (issue 49): which cutover's green lineage a generation runs
(`cutover_of_lineage`, the rule a rollback of green follows back to blue's final savepoint
S), and so which savepoints a cutover relies on (`cutover_savepoints`, the rule savepoint
history retention keeps them by). One home for both: the rollback (`services.rollback`)
and retention (`retention.relied_on_savepoints`) read the same rule; retention reads
whether a cutover ended, never how, and an unreadable end record as none (`read_cutover`:
the cutover counts as open). Reads only; the records are `checkpoints.cutover`'s. Pure
Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.commit_head import read_commit_head
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import (
    CutoverAgreement,
    CutoverClaim,
    CutoverDecision,
    CutoverEnd,
    CutoverPlan,
    CutoverState,
    CutoverStore,
)
from airflow_sparkpoint.exceptions import (
    ControlError,
    CorruptRecord,
    CutoverError,
    InvalidPath,
    RestoreError,
    SparkpointError,
)

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry

__all__ = ["cutover_of_generation", "cutover_of_lineage", "cutover_savepoints", "green_committed_past",
           "read_cutover"]


def cutover_of_generation(catalog: Catalog, generation: int) -> CutoverState | None:
    """The cutover generation `generation` took the job over at (its generation claim
    names it and the cutover's claim, decided or recorded, is that generation's), or None.
    How the cutover ended is not read (`read_cutover`).

    :raises CutoverError: that cutover's plan is unreadable.
    """
    claim = catalog.generation_claim(generation)
    cutover_id = claim.details.get("cutover") if claim is not None else None
    if not isinstance(cutover_id, str) or not cutover_id:
        return None
    state = read_cutover(CutoverStore(catalog), cutover_id)
    if state.taken is None or state.taken.generation != generation:
        return None
    return state


def cutover_of_lineage(catalog: Catalog, generation: int) -> CutoverState | None:
    """The cutover whose green's lineage generation `generation` runs: the generation
    that claimed it (`cutover_of_generation`), or a later one that started at the
    cutover's batch N from a snapshot of N made since blue's final checkpoint X (X
    itself, blue's final savepoint, green's adoption checkpoint, a copy of one: a restart
    of green's, e.g. its task's retry with ``restore=latest``). Only the newest cutover
    claimed before `generation` counts. None otherwise. How a cutover ended is not read
    (`read_cutover`).

    :raises CutoverError: a cutover's plan is unreadable.
    """
    state = cutover_of_generation(catalog, generation)
    if state is not None:
        return state
    origin = next((o for o in catalog.origins() if o.generation == generation), None)
    if origin is None or origin.batch_id is None or origin.snapshot_id is None:
        return None
    store = CutoverStore(catalog)
    for cutover_id in reversed(store.ids()):
        state = read_cutover(store, cutover_id)
        claim = state.taken
        if claim is None or claim.generation >= generation:
            continue
        try:
            match = layout.CHK_RE.match(catalog.snapshot_key(claim.checkpoint))
        except SparkpointError:
            match = None
        since_x = match is not None and origin.snapshot_id >= int(match.group(1))
        if since_x and origin.batch_id == claim.batch_id:
            return state
        return None
    return None


def cutover_savepoints(catalog: Catalog, savepoints: Iterable[SnapshotEntry]) -> dict[str, str]:
    """The keys of `savepoints` (a listing taken before this call) that a cutover relies
    on, each with why: blue's final savepoint S of N that a rollback of green's generation
    returns to (`services.rollback`), kept

    * while the job's newest lineage is the cutover's green lineage (`cutover_of_lineage`
      of the newest origin's generation), its ``claimed`` names S, and the job's commit
      head names no commit past N by green's generation or a later one
      (`green_committed_past`): once green's lineage committed past N, the rollback finds
      the sink ahead of S and returns to green's own checkpoint. Once another lineage is
      the newest (a restore, a restart from a later checkpoint of green's, a newer
      deploy), no rollback returns to S either: it is ordinary history;
    * before green's claim, while the cutover may still be claimed (`_before_claim`): the
      savepoints of blue's generation of a batch a ``stop_after`` request to blue names
      (S is blue's savepoint of the batch of the request the agreement names).

    Read in this order after the caller's listing of the savepoints, so that a savepoint
    it listed is judged by records at least as new: the cutovers, then the origins
    (green's is written before its ``claimed``). An unreadable end record counts as no end
    (`read_cutover`: the cutover may be open, and its plan says what it can still claim).

    :raises CutoverError: a cutover's plan is unreadable (nothing is judged).
    """
    listed = {e.key: e for e in savepoints if e.metadata is not None}
    store = CutoverStore(catalog)
    ids = store.ids()
    if not listed or not ids:
        return {}
    kept: dict[str, str] = {}
    for cutover_id in reversed(ids):
        read = read_cutover(store, cutover_id)
        # Until green's claimed record, not its decision: a decided green may not have
        # written its origin yet (read below), and S must still be kept then. An abort
        # decision ends the cutover (green can no longer claim).
        if read.ended is None and read.claimed is None:
            kept.update(_before_claim(catalog, store, read, listed))
    origins = catalog.origins()
    if origins:
        newest = max(origins, key=lambda o: o.generation)
        state = cutover_of_lineage(catalog, newest.generation)
        claim = state.taken if state is not None else None
        if state is not None and claim is not None and claim.savepoint is not None \
                and not green_committed_past(catalog, claim):
            try:
                final: str | None = catalog.snapshot_key(claim.savepoint, savepoint_only=True)
            except (RestoreError, InvalidPath):  # not a savepoint of this job's root: not ours
                final = None
            if final is not None and final in listed:
                kept[final] = (f"blue's final savepoint of cutover {state.id}: a rollback of green's "
                               "generation returns there")
    return kept


def green_committed_past(catalog: Catalog, claim: CutoverClaim) -> bool:
    """Whether the job's commit head (`commit_head`, written after a sink confirmed a
    commit) names a batch past the cutover's N committed by green's generation or a later
    one: the sink then holds it, so a rollback of green's lineage finds the sink ahead of
    blue's final savepoint and returns to green's own checkpoint
    (`services.rollback._blue_savepoint_origin`, which reads the sink itself). Only a
    start of a newer generation rewinds a sink, and one that starts at N restarts from a
    snapshot of N, where a rollback of it returns. False when the head is missing or
    unreadable (a failed head write lags behind: S is kept longer).

    :raises StorageError: the store cannot be read.
    """
    head = read_commit_head(catalog)
    return head is not None and head.generation >= claim.generation and head.batch > claim.batch_id


def read_cutover(store: CutoverStore, cutover_id: str) -> CutoverState:
    """Cutover `cutover_id`'s records as `CutoverStore.read` reads them; an unreadable
    end record (``done``) or decision is read as none, with its error in ``errors``: the
    cutover counts as open (fail closed, as `CutoverStore.open_cutover` counts it), and
    what it may still claim is read from its plan, agreement, decision and claim
    (`_before_claim`).

    :raises CutoverError: its plan is missing, unreadable or another job's.
    """
    try:
        return store.read(cutover_id)
    except CutoverError as exc:
        unreadable = exc
    parsed: dict[str, Any] = {}
    for part, parse in (("plan", CutoverPlan.from_json), ("agreed", CutoverAgreement.from_json),
                        ("decision", CutoverDecision.from_json), ("claimed", CutoverClaim.from_json),
                        ("rollback", CutoverEnd.from_json)):
        key = layout.cutover_key(cutover_id, part)
        try:
            parsed[part] = bounded.read_record(store.store, key, bounded.json_object(parse),
                                               limits=layout.limits_of(key),
                                               where=f"{store.catalog.uri}/{key}")
        except CorruptRecord:
            parsed[part] = None
    plan = parsed["plan"]
    if plan is None or plan.id != cutover_id or plan.job != store.catalog.job:
        raise unreadable
    return CutoverState(plan, None, parsed["agreed"], parsed["claimed"], None, (str(unreadable),),
                        parsed["rollback"], parsed["decision"])


def _before_claim(catalog: Catalog, store: CutoverStore, state: CutoverState,
                  listed: dict[str, SnapshotEntry]) -> dict[str, str]:
    """Of `listed`, the savepoints that cutover `state` (open, or its end unreadable; not
    claimed when read) may still name as blue's final savepoint S in green's claim, each
    with why. S is the savepoint blue takes at its stop after the batch of the
    ``stop_after`` request the agreement names, and the claim reads it from that
    request's result (`runtime.cutover.adopt`): so a savepoint of blue's generation of

    * the agreed batch N, once agreed;
    * before that, a batch a ``stop_after`` request to blue's generation names (read
      after the listing, then the cutover again: the request is filed before blue takes S,
      and read by green's claim after an agreement written since; a request filed after
      this read makes an S after the listing). One of the job's requests unreadable:
      every batch from the warm-up on (fail closed).

    None once generation blue + 1 is another start's (a claim names no cutover or
    another one): green claims exactly that generation, so it never will.
    """
    plan = state.plan
    try:
        successor = catalog.generation_claim(plan.blue_generation + 1)
    except SparkpointError:  # unreadable: it may be green's
        successor = None
    if successor is not None and successor.details.get("cutover") != plan.id:
        return {}
    requested: set[int] | None = set()
    agreed = state.agreed
    if agreed is None:
        requested = _stop_after_batches(catalog, plan.blue_generation)
        agreed = read_cutover(store, state.id).agreed
    batches = requested if requested is not None else set()
    if agreed is not None:
        batches.add(agreed.after_batch)
    kept = {}
    for key, entry in listed.items():
        meta = entry.metadata
        assert meta is not None
        if meta.generation == plan.blue_generation and (
                meta.batch_id in batches or (requested is None and meta.batch_id >= plan.warmup_batch)):
            kept[key] = (f"blue's final savepoint of open cutover {state.id}: green's claim names it, "
                         "and a rollback of green's generation returns there")
    return kept


def _stop_after_batches(catalog: Catalog, generation: int) -> set[int] | None:
    """The batches the job's ``stop_after`` requests to `generation` name (of any
    cutover, or none), or None when one of its control requests cannot be read."""
    channel = ControlChannel(catalog)
    batches = set()
    for request_id in channel.request_ids():
        try:
            request = channel.read_request(request_id)
        except ControlError:
            return None
        if request.kind == "stop_after" and request.generation == generation \
                and request.after_batch is not None:
            batches.add(request.after_batch)
    return batches
