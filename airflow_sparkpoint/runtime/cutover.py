"""Green's claim of a job at the end of a zero-downtime cutover (issue 49): `adopt`.

Blue (generation gB) served the cutover's ``stop_after`` request: it stopped after
batch N, its final checkpoint X is at N and its sinks hold exactly batches through N.
Green, warmed up in a shadow identity and at N too, takes the job over here: it claims
*exactly* generation gB + 1 (any other start since blue's stop took it first, and the
cutover is off), reads everything again after the claim (invariant 8), and records the
origin of its lineage with X as the base (so X is kept by retention, and a restart of the
job before green's own first checkpoint resumes blue's state at N exactly). Before the
origin it takes the cutover's decision (``claim``; a call-off takes ``abort``: the first
stands), after it the cutover's ``claimed`` record. The caller (green's runtime) goes on
as generation gB + 1: its adoption checkpoint, its first batch N + 1 into the production
sink.

docs/PROTOCOL.md, "Zero-downtime cutover", has the protocol; the records are
`checkpoints.cutover`'s.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import (
    CutoverClaim,
    CutoverEnd,
    CutoverProgress,
    CutoverState,
    CutoverStore,
)
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.checkpoints.history_records import generation_details
from airflow_sparkpoint.checkpoints.lineage import Origin, new_origin
from airflow_sparkpoint.exceptions import ControlError, CutoverError
from airflow_sparkpoint.runtime.config import SUBMITTER_ENV
from airflow_sparkpoint.sinks.transactions import settle_all

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.follow_record import FollowProgress
    from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
    from airflow_sparkpoint.sinks.base import Sink

__all__ = ["Adoption", "CutoverHandover", "adopt", "blue_final_checkpoint", "blue_final_savepoint",
           "record_first_commit", "taken_over"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Adoption:
    """What `adopt` did: green is generation `generation` of the job from batch
    `batch_id` on; `checkpoint` is blue's final checkpoint at that batch (the base of
    green's lineage, at `checkpoint_uri`); `origin` the origin record written; `aborted`
    the batches of blue's leftover transactions past N that were aborted."""

    cutover_id: str
    generation: int
    batch_id: int
    checkpoint: SnapshotMetadata
    checkpoint_uri: str
    origin: Origin
    aborted: tuple[int, ...] = ()


def blue_final_checkpoint(catalog: Catalog, state: CutoverState) -> tuple[int, SnapshotMetadata, str]:
    """``(N, X, X's uri)``: the agreed batch and blue's final checkpoint at it, from the
    completed result of the cutover's ``stop_after`` request (`blue_final_savepoint`
    reads blue's savepoint of N from the same result). Reads only.

    :raises CutoverError: not agreed, the request did not complete at N (failed,
        expired, pending, or stopped elsewhere), or its checkpoint is not blue's at N.
    """
    plan, agreed = state.plan, state.agreed
    if agreed is None:
        raise CutoverError(f"cutover {plan.id} of job {catalog.job!r} is not agreed yet (no batch N)")
    channel = ControlChannel(catalog)
    try:
        request = channel.read_request(agreed.request_id)
        result = channel.result(agreed.request_id)
    except ControlError as exc:
        raise CutoverError(f"cutover {plan.id}: blue's stop_after request {agreed.request_id}: "
                           f"{exc}") from None
    n = agreed.after_batch
    if request.kind != "stop_after" or request.after_batch != n or request.generation != plan.blue_generation:
        raise CutoverError(f"cutover {plan.id}: request {request.id} is a {request.kind} request "
                           f"(after_batch {request.after_batch}) to generation {request.generation}; "
                           "expected "
                           f"stop_after {n} to blue's generation {plan.blue_generation}")
    if result.state != "completed" or result.batch_id != n or not result.checkpoint:
        raise CutoverError(f"cutover {plan.id}: blue's stop_after request {request.id} is {result.state} "
                           f"(batch {result.batch_id}, checkpoint {result.checkpoint}); "
                           "green takes over only "
                           f"after blue stopped at batch {n}" + (f": {result.error}" if result.error else ""))
    handle = catalog.own_snapshot(result.checkpoint)
    if handle is None or handle.metadata.batch_id != n or handle.metadata.generation != plan.blue_generation:
        found = "missing" if handle is None else (f"batch {handle.metadata.batch_id} of generation "
                                                  f"{handle.metadata.generation}")
        raise CutoverError(f"cutover {plan.id}: blue's final checkpoint {result.checkpoint} is {found}; "
                           "expected a completed checkpoint of "
                           f"batch {n} by generation {plan.blue_generation}")
    return n, handle.metadata, result.checkpoint


def blue_final_savepoint(catalog: Catalog, state: CutoverState) -> str | None:
    """The URI of blue's final savepoint of N, as the completed result of the cutover's
    ``stop_after`` request names it (None: a blue that took none). Reads only.

    :raises CutoverError: not agreed, or the request's records are unreadable.
    """
    if state.agreed is None:
        raise CutoverError(f"cutover {state.plan.id} of job {catalog.job!r} is not agreed yet (no batch N)")
    try:
        return ControlChannel(catalog).result(state.agreed.request_id).savepoint
    except ControlError as exc:
        raise CutoverError(f"cutover {state.plan.id}: blue's stop_after request {state.agreed.request_id}: "
                           f"{exc}") from None


def adopt(
    catalog: Catalog,
    sink: Sink,
    cutover_id: str,
    *,
    live_dir: str | None,
    adopted_from: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> Adoption:
    """Claim job `catalog.job` for green at the end of cutover `cutover_id`: claim
    exactly blue's generation + 1, check after the claim that the cutover is still open,
    that blue's final checkpoint is at the agreed batch N and that `sink` holds exactly
    the job's batches through N (blue's leftover transactions past N are aborted first:
    they were never confirmed), then write the origin of green's lineage (base: blue's
    final checkpoint; `live_dir`: green's live location, which holds green's state at N)
    and the cutover's ``claimed`` record. Between the checks and the origin, green takes
    the cutover's decision: a call-off that took it first wins, and green writes nothing
    more.

    :param sink: the job's production sink, as green will write it.
    :param live_dir: green's live location (recorded in the origin), or None.
    :param adopted_from: green's own shadow checkpoint at N (recorded in the origin).
    :param details: recorded with the generation claim (submitter token, release...).
    :raises CutoverError: before the claim: the cutover is not agreed, done, claimed, or
        blue did not complete its stop at N (nothing written). After it: generation
        gB + 1 was taken by another start (nothing written), the cutover was ended or
        called off meanwhile (the call-off won the decision), or the sink is not at N
        (green's claim stays, fencing a stopped blue; no origin is written, so
        ``restore=latest`` resumes blue's lineage at N).
    :raises StaleGeneration: a newer generation was claimed after green's, before its
        origin (nothing more is written).
    """
    store = CutoverStore(catalog)
    state = store.read(cutover_id)
    _check_open(state)
    n, final, final_uri = blue_final_checkpoint(catalog, state)
    blue = state.plan.blue_generation
    claim = catalog.claim_generation_after(blue, {**dict(details or {}), "cutover": cutover_id,
                                                  "restore": f"adopt:{final_uri}"})
    if claim is None:
        taken = catalog.generation_claim(blue + 1)
        raise CutoverError(f"cutover {cutover_id} of job {catalog.job!r}: generation {blue + 1} was "
                           "claimed by another start "
                           f"({taken.details.get('restore') if taken else 'unknown'}) after blue "
                           "stopped; green does not take over (call the cutover off and start the job again)")
    generation = claim.generation
    fence = Fence(catalog, generation)
    faults.maybe_kill("cutover_claimed", n)
    # Claim, then act: everything is read again after the claim.
    state = store.read(cutover_id)
    _check_open(state, claimed_ok=False)
    n_again, final, final_uri = blue_final_checkpoint(catalog, state)
    if n_again != n:  # write-once records: cannot happen unless the store lies
        raise CutoverError(f"cutover {cutover_id}: the agreed batch changed from {n} to {n_again}")
    leftovers = [r for r in catalog.transactions() if r.batch_id > n]
    settled = settle_all(catalog, leftovers, lambda _r: sink, confirmed=False, fence=fence)
    position = sink.committed_position(catalog.job)
    if position != n:
        raise CutoverError(f"cutover {cutover_id} of job {catalog.job!r}: the sink {sink.sink_id} "
                           f"holds the job's batches through {position}, not through the agreed batch {n}; "
                           "green does not "
                           "take over (restore=latest resumes blue's lineage)")
    fence.check()
    savepoint = blue_final_savepoint(catalog, state)
    green_claim = CutoverClaim(cutover_id, generation, n, final_uri, claim.started_at, savepoint)
    decided = store.decide_claim(green_claim)
    if decided.claim != green_claim:
        raise CutoverError(f"cutover {cutover_id} of job {catalog.job!r} was called off before green's claim "
                           f"was decided ({decided.by or 'by someone'}: {decided.reason or 'no reason'}); "
                           f"green does not take over (its generation {generation} fenced the stopped blue: "
                           "restore=latest resumes blue's lineage)")
    fence.check()  # a start may take the job from a decided green, as from any generation
    origin = new_origin(
        generation, kind="checkpoint", uri=final_uri, base_id=final.id, snapshot_id=final.id, batch_id=n,
        id_floor=catalog.next_checkpoint_id() - 1,
        restore={"restore": final_uri, "sink_ahead": "fail", "force": False, "allow_foreign_job": False,
                 "cutover": cutover_id, "adopted_from": adopted_from, "warmup_from": state.plan.warmup_uri},
        live_dir=live_dir, host=socket.gethostname(), pid=os.getpid(), base_generation=final.generation,
    )
    catalog.write_origin(origin)
    store.claim(green_claim)
    log.info("cutover %s: generation %d took job %s over at batch %d (base %s)", cutover_id, generation,
             catalog.job, n, final_uri)
    return Adoption(cutover_id, generation, n, final, final_uri, origin,
                    tuple(s.record.batch_id for s in settled if s.outcome == "aborted"))


def record_first_commit(catalog: Catalog, generation: int, batch_id: int) -> CutoverEnd | None:
    """After generation `generation`'s first commit (batch `batch_id`) into the job's
    sinks: if that generation is the green of a cutover (its generation claim names the
    cutover, `adopt`, and the cutover's ``claimed`` record is that generation's), end the
    cutover as ``committed`` at step ``first_commit``; the first end written holds. A run
    that is no cutover's green ends a cutover an earlier green left ``claimed``
    (`_end_left_claimed`). Returns the end, or None. One read of the generation's claim,
    and the cutover's records (for a run that is no green: one listing, when no cutover
    was ever planned).

    :raises CutoverError: the cutover's records are unreadable.
    :raises StorageError: the store cannot be read or written.
    """
    claim = catalog.generation_claim(generation)
    cutover_id = claim.details.get("cutover") if claim is not None else None
    store = CutoverStore(catalog)
    if not isinstance(cutover_id, str) or not cutover_id:
        return _end_left_claimed(store, generation, batch_id)
    state = store.read(cutover_id)
    if state.taken is None or state.taken.generation != generation:
        return None  # claimed, then refused before the cutover's decision: never took over
    if state.ended is not None:
        return state.ended
    end = store.end(cutover_id, "committed", step="first_commit", generation=generation,
                    reason=(f"generation {generation} committed batch {batch_id}, "
                            "its first into the job's sinks"),
                    by=f"generation {generation}")
    log.info("cutover %s of job %s: %s at %s (generation %d committed batch %d)", cutover_id, catalog.job,
             end.outcome, end.step, generation, batch_id)
    return end


def _end_left_claimed(store: CutoverStore, generation: int, batch_id: int) -> CutoverEnd | None:
    """A green killed between its decision and its end record (before its origin, or
    before or right after its first commit) leaves its cutover ``claimed``; its restart is a
    newer generation with no cutover in its claim, and its first commit continues green's
    lineage past N: it ends the cutover ``committed``. Returns the end, or None (no cutover left claimed)."""
    state = store.open_cutover()
    taken = state.taken if state is not None else None
    if state is None or taken is None or taken.generation >= generation:
        return None
    green = taken.generation
    end = store.end(state.id, "committed", step="first_commit", generation=generation,
                    reason=(f"generation {green} (green) took the job over at batch {taken.batch_id} "
                            f"and ended without recording it; generation {generation} continues its "
                            f"lineage and committed batch {batch_id}"),
                    by=f"generation {generation}")
    log.info("cutover %s of job %s: %s at %s (green generation %d left it claimed; generation %d committed "
             "batch %d)", state.id, store.catalog.job, end.outcome, end.step, green, generation, batch_id)
    return end


def taken_over(catalog: Catalog, cutover_id: str) -> int | None:
    """The generation that took `catalog`'s job over at cutover `cutover_id` (its
    decided ``claim``, with or without its ``claimed`` record: a green that died between
    the two), unless the cutover ended other than committed or green was rolled back
    after it; else None. A green started again with the cutover's settings
    after that claim (an Airflow retry of a green killed at or after its first commit)
    is a restart of the job (``restore=latest``), not a warm-up its claim would refuse.

    :raises CutoverError: no such cutover, or its records are unreadable.
    """
    state = CutoverStore(catalog).read(cutover_id)
    taken, ended = state.taken, state.ended
    if taken is None or state.rolled_back is not None:
        return None
    if ended is not None and ended.outcome != "committed":
        return None
    return taken.generation


def _check_open(state: CutoverState, *, claimed_ok: bool = False) -> None:
    plan, ended, taken = state.plan, state.ended, state.taken
    if ended is not None:
        raise CutoverError(f"cutover {plan.id} of job {plan.job!r} is done ({ended.outcome} at "
                           f"{ended.step}: {ended.reason or 'no reason'}); "
                           "green does not take over")
    if taken is not None and not claimed_ok:
        raise CutoverError(f"cutover {plan.id} of job {plan.job!r} was claimed by generation "
                           f"{taken.generation} already")


class CutoverHandover:
    """`runtime.follow.Handover` over the cutover's records: what green's follower asks
    of cutover `cutover_id` of blue's job (`catalog`), with the production `sink`."""

    def __init__(self, catalog: Catalog, sink: Sink, cutover_id: str) -> None:
        self.catalog = catalog
        self.sink = sink
        self.cutover_id = cutover_id
        self.store = CutoverStore(catalog)

    def _open(self) -> CutoverState:
        state = self.store.read(self.cutover_id)
        _check_open(state, claimed_ok=True)
        return state

    def report(self, progress: FollowProgress, shadow_generation: int) -> None:
        """Green's progress into ``<cid>.green.json`` (overwritten).

        :raises CutoverError: the cutover ended."""
        self.store.progress(CutoverProgress(
            self.cutover_id, progress.last_replayed, progress.seconds_per_batch, shadow_generation,
            progress.verified_through, progress.difference, progress.updated_at))

    def agreed_batch(self) -> int | None:
        """N once agreed, else None.

        :raises CutoverError: the cutover ended."""
        agreed = self._open().agreed
        return None if agreed is None else agreed.after_batch

    def blue_stopped(self) -> bool:
        """Whether blue completed its stop after N (False while its request is pending or taken).

        :raises CutoverError: the cutover ended, or blue's stop failed, expired or ended elsewhere."""
        state = self._open()
        if state.agreed is None:
            return False
        result = ControlChannel(self.catalog).result(state.agreed.request_id)
        if result.state in ("pending", "acknowledged"):
            return False
        blue_final_checkpoint(self.catalog, state)  # raises unless completed at N
        return True

    def adopt(self, live_dir: str, adopted_from: str | None) -> int:
        """`adopt`; returns the generation claimed.

        :raises CutoverError: see `adopt`."""
        # Who started green, as any driver's claim records it: the submit's token (the
        # operator finds its run by it, `services.runs.find_claim`) and the Airflow try.
        details = {"submitter": os.environ.get(SUBMITTER_ENV, ""), "plan": f"cutover {self.cutover_id}",
                   **generation_details()}
        return adopt(self.catalog, self.sink, self.cutover_id, live_dir=live_dir,
                     adopted_from=adopted_from, details=details).generation
