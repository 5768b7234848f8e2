"""Blue's side of a zero-downtime cutover, as the front ends ask for it (`sparkpoint
savepoint --stop --after-batch N`, `sparkpoint cutover list|call-off`, the orchestrator):
ask the live run to stop after batch N, and list or call off the cutovers of a job. The
records are `checkpoints.cutover`'s, the run's side `runtime.run_coordination`'s, green's
claim `runtime.cutover.adopt`; which generation runs a cutover green's lineage is
`checkpoints.cutover_lineage`'s rule (re-exported here: the rollback and savepoint
retention both follow it). Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverEnd, CutoverState, CutoverStore
from airflow_sparkpoint.checkpoints.cutover_lineage import cutover_of_generation, cutover_of_lineage
from airflow_sparkpoint.checkpoints.history import generation_alive
from airflow_sparkpoint.exceptions import CatalogError, ControlError, CutoverError
from airflow_sparkpoint.services.savepoint import savepoint_source

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["StopAfter", "call_off", "cutover_of_generation", "cutover_of_lineage", "cutovers",
           "note_rollback", "stop_after_batch", "withdraw_stop_after"]


@dataclass(frozen=True)
class StopAfter:
    """What `stop_after_batch` did: request `request_id` to generation `generation`;
    `state` ``pending`` (not waited for) or ``completed``; once completed the run stopped
    after `batch_id` (= `after_batch`) with its final checkpoint at `checkpoint` and its
    final savepoint of that batch at `savepoint`."""

    request_id: str
    generation: int
    after_batch: int
    state: str
    batch_id: int | None = None
    checkpoint: str | None = None
    savepoint: str | None = None


def stop_after_batch(catalog: Catalog, after_batch: int, *, timeout_s: float, poll_s: float,
                     max_heartbeat_age: float, requested_by: str, wait: bool = True,
                     generation: int | None = None, cutover_id: str | None = None) -> StopAfter:
    """Ask the live run of `catalog`'s job to stage and commit exactly through batch
    `after_batch`, take its final checkpoint and its final savepoint there and stop; wait
    for it (`wait`).

    :param generation: the run it is meant for (the cutover plan's blue generation); the
        live run must be that one. None: whichever run is live.
    :param cutover_id: the cutover the request is filed for (recorded in it: the
        cutover's `call_off` withdraws it, even before the agreement names it, and the run
        refuses it once the cutover ended).
    :raises ConfigError: `after_batch` is not an integer >= 0, or a bad timeout.
    :raises CatalogError: no live run (there is nothing to stop after a batch: unlike a
        savepoint, no checkpoint copy stands in for it), or not `generation`.
    :raises ControlError: the run refused (already past the batch, external commit mode,
        another stop in force), ended elsewhere, died, or `timeout_s` passed.
    """
    source = savepoint_source(catalog, max_heartbeat_age)
    if source.run is None:
        raise CatalogError(f"job {catalog.job!r} {source.why_not_running()}; there is no run to stop after "
                           f"batch {after_batch}")
    if generation is not None and source.run.generation != generation:
        raise CatalogError(f"job {catalog.job!r} runs generation {source.run.generation}, not {generation}; "
                           "no stop_after request filed")
    channel = ControlChannel(catalog)
    request = channel.submit("stop_after", generation=source.run.generation, timeout_s=timeout_s,
                             requested_by=requested_by, after_batch=after_batch, cutover=cutover_id)
    if not wait:
        return StopAfter(request.id, source.run.generation, after_batch, "pending")
    run = source.run.generation
    result = channel.wait(request.id, timeout_s=timeout_s, poll_s=poll_s,
                          is_alive=lambda: generation_alive(catalog, run, max_heartbeat_age))
    if result.batch_id != after_batch or not result.checkpoint:
        raise ControlError(f"stop_after request {request.id} of job {catalog.job!r} completed at batch "
                           f"{result.batch_id} ({result.checkpoint}), not after batch {after_batch}")
    return StopAfter(request.id, run, after_batch, result.state, result.batch_id, result.checkpoint,
                     result.savepoint)


def cutovers(catalog: Catalog) -> list[CutoverState]:
    """Every cutover of `catalog`'s job, oldest first.

    :raises CutoverError: a plan or end record is unreadable (named).
    """
    store = CutoverStore(catalog)
    return [store.read(cutover_id) for cutover_id in store.ids()]


def call_off(catalog: Catalog, cutover_id: str, *, reason: str, by: str) -> CutoverEnd:
    """End cutover `cutover_id` as aborted (unless it ended already: then how it ended).
    First the cutover's decision is taken (``abort``; green takes ``claim`` before its
    origin: the first stands, `CutoverStore.decide_abort`); a call-off that lost it ends
    nothing. A call-off again after one that died resumes it (the decision is its own).
    Every ``stop_after`` request of the cutover no run took yet is withdrawn, before and
    after the end record: the agreed one, and one filed but not agreed yet (the
    orchestrator died between the two; the request names the cutover). A run that took
    one stops after its batch regardless (restart it with ``restore=latest``, which
    resumes its own lineage exactly); a run refuses one whose cutover ended
    (`runtime.run_coordination`). Green's claim, if it came first, stands: a cutover
    claimed is green's job (roll it back as any deploy).

    :raises CutoverError: no such cutover, or green's claim was decided first (or, of a
        release before the decision record, recorded).
    """
    store = CutoverStore(catalog)
    state = store.read(cutover_id)
    step = "stop" if state.agreed is not None else "warmup"
    if state.done is None:
        if state.claimed is not None and state.decision is None:  # a green of the release before
            raise CutoverError(f"cutover {cutover_id} of job {catalog.job!r} was claimed by green "
                               f"(generation {state.claimed.generation}); it is green's job now: roll it "
                               "back instead")
        # raises when green's claim was decided first: it stands
        decided = store.decide_abort(cutover_id, step=step, reason=reason, by=by)
        reason, by, step = decided.reason, decided.by, decided.step or step
    why = f"cutover {cutover_id} called off: {reason}"
    withdraw_stop_after(catalog, state, why)
    end = store.end(cutover_id, "aborted", step=step, reason=reason, by=by)
    # Again after the end: a request filed between the first look and the end (an
    # orchestrator that then finds the cutover ended withdraws its own, unless it died).
    withdraw_stop_after(catalog, store.read(cutover_id), why)
    return end


def withdraw_stop_after(catalog: Catalog, state: CutoverState, reason: str) -> list[str]:
    """Withdraw the ``stop_after`` requests of cutover `state` that no run took yet (the
    agreed one, and every pending one naming the cutover); returns their ids. A request
    gone or unreadable is skipped (logged by the channel): the end record is what counts."""
    channel = ControlChannel(catalog)
    ids = {r.id for r in channel.pending(state.plan.blue_generation)
           if r.kind == "stop_after" and r.cutover == state.id}
    if state.agreed is not None:
        ids.add(state.agreed.request_id)
    withdrawn = []
    for request_id in sorted(ids):
        try:
            if channel.withdraw(request_id, reason).state == "expired":
                withdrawn.append(request_id)
        except ControlError:
            continue
    return withdrawn


def note_rollback(catalog: Catalog, generation: int, *, reason: str, by: str,
                  restore: str | None = None) -> CutoverEnd | None:
    """After a rollback of generation `generation` (`services.rollback`): if it runs a
    cutover's green's lineage (`cutover_of_lineage`), record the cutover as rolled back
    (written once; its ``done`` stays), with `restore`, the point the job's lineage returned to (blue's final
    savepoint, or green's checkpoint). Returns the record, or None (not a cutover's green).

    :raises CutoverError: the cutover's records are unreadable.
    """
    state = cutover_of_lineage(catalog, generation)
    if state is None:
        return None
    return CutoverStore(catalog).roll_back(state.id, generation=generation, reason=reason, by=by,
                                           restore=restore)
