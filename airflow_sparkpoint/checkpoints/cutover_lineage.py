"""Cutovers and lineages (issue 49): which cutover's green lineage a generation runs
(`cutover_of_lineage`, the rule a rollback of green follows back to blue's final savepoint
S), and so which savepoints a cutover relies on (`cutover_savepoints`, the rule savepoint
history retention keeps them by). One home for both: the rollback (`services.rollback`)
and retention (`retention.relied_on_savepoints`) read the same rule. Reads only; the
records are `checkpoints.cutover`'s. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.cutover import CutoverState, CutoverStore
from airflow_sparkpoint.exceptions import InvalidPath, RestoreError, SparkpointError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.catalog_types import SnapshotEntry

__all__ = ["cutover_of_generation", "cutover_of_lineage", "cutover_savepoints"]


def cutover_of_generation(catalog: Catalog, generation: int) -> CutoverState | None:
    """The cutover generation `generation` took the job over at (its generation claim
    names it and the cutover's claim, decided or recorded, is that generation's), or None.

    :raises CutoverError: that cutover's records are unreadable.
    """
    claim = catalog.generation_claim(generation)
    cutover_id = claim.details.get("cutover") if claim is not None else None
    if not isinstance(cutover_id, str) or not cutover_id:
        return None
    state = CutoverStore(catalog).read(cutover_id)
    if state.taken is None or state.taken.generation != generation:
        return None
    return state


def cutover_of_lineage(catalog: Catalog, generation: int) -> CutoverState | None:
    """The cutover whose green's lineage generation `generation` runs: the generation
    that claimed it (`cutover_of_generation`), or a later one that started at the
    cutover's batch N from a snapshot of N made since blue's final checkpoint X (X
    itself, blue's final savepoint, green's adoption checkpoint, a copy of one: a restart
    of green's, e.g. its task's retry with ``restore=latest``). Only the newest cutover
    claimed before `generation` counts. None otherwise.

    :raises CutoverError: a cutover's records are unreadable.
    """
    state = cutover_of_generation(catalog, generation)
    if state is not None:
        return state
    origin = next((o for o in catalog.origins() if o.generation == generation), None)
    if origin is None or origin.batch_id is None or origin.snapshot_id is None:
        return None
    store = CutoverStore(catalog)
    for cutover_id in reversed(store.ids()):
        state = store.read(cutover_id)
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
      of the newest origin's generation) and its ``claimed`` names S; once another
      lineage is the newest (a restore, a restart from a later checkpoint of green's, a
      newer deploy), no rollback returns to S: it is ordinary history;
    * before green's claim, while the cutover is open (its ``claimed`` is what will name
      S, from blue's ``stop_after`` result): every savepoint of blue's generation of the
      agreed batch N (of a batch from the warm-up on while nothing is agreed: blue may
      have stopped before the agreement was written). A call-off ends it.

    Read in this order after the caller's listing of the savepoints, so that a savepoint
    it listed is judged by records at least as new: the cutovers (an open one, else the
    claim), then the origins (green's is written before its ``claimed``).

    :raises CutoverError: a cutover's plan or end record is unreadable (nothing is judged).
    """
    listed = {e.key: e for e in savepoints if e.metadata is not None}
    store = CutoverStore(catalog)
    if not listed or not store.ids():
        return {}
    kept: dict[str, str] = {}
    state = store.open_cutover()
    # Until green's claimed record, not its decision: a decided green may not have written
    # its origin yet (read below), and the origins must then still keep S.
    if state is not None and state.claimed is None:
        plan, agreed = state.plan, state.agreed
        for key, entry in listed.items():
            meta = entry.metadata
            assert meta is not None
            at_n = (meta.batch_id == agreed.after_batch if agreed is not None
                    else meta.batch_id >= plan.warmup_batch)
            if meta.generation == plan.blue_generation and at_n:
                kept[key] = (f"blue's final savepoint of open cutover {state.id}: green's claim names it, "
                             "and a rollback of green's generation returns there")
    origins = catalog.origins()
    if origins:
        newest = max(origins, key=lambda o: o.generation)
        state = cutover_of_lineage(catalog, newest.generation)
        claim = state.taken if state is not None else None
        savepoint = claim.savepoint if claim is not None else None
        if state is not None and savepoint is not None:
            try:
                final: str | None = catalog.snapshot_key(savepoint, savepoint_only=True)
            except (RestoreError, InvalidPath):  # not a savepoint of this job's root: not ours
                final = None
            if final is not None and final in listed:
                kept[final] = (f"blue's final savepoint of cutover {state.id}: a rollback of green's "
                             "generation returns there")
    return kept
