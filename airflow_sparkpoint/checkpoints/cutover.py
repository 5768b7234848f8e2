"""The records of a zero-downtime cutover (issue 49): blue, the running generation of a
job, hands the job to green at an agreed batch N. One module writes and reads them; the
keys are `layout.cutover_key`'s, under ``<job>/cutover/``::

    <cid>.plan.json     the orchestrator  put_if_absent: blue's generation, green's warm-up
                                          start, green's shadow identity, mode and bounds
    <cid>.green.json    green             overwritten: how far the warm-up replayed
    <cid>.agreed.json   the orchestrator  put_if_absent: N and blue's ``stop_after`` request
    <cid>.decision.json green or a        put_if_absent: ``claim`` (green's generation, after
                        call-off          its claim and checks, before its origin) or ``abort``
                                          (the call-off, before its end); the first stands
    <cid>.claimed.json  green             put_if_absent: green's generation (blue's + 1),
                                          written after the claim and the checks after it
    <cid>.done.json     green or the      put_if_absent: how it ended (committed, aborted,
                        orchestrator      rolled_back); the first writer decides. Green's
                                          run writes ``committed`` after its first commit
                                          into blue's sinks (`runtime.cutover`)
    <cid>.rollback.json the rollback      put_if_absent: green's generation was rolled back
                                          after the cutover committed (`services.rollback`);
                                          the done record stays as it was

Every record but the progress is written once (an atomic create) and never rewritten: a
step's precondition is read, and its record's create is the step. Green's claim and a
call-off both read, then act: the decision record is what makes them exclusive (the
loser sees the winner's and stands down). A cutover is *open* from its plan until its
done record or an ``abort`` decision (`CutoverState.ended`); while one is open and no
claim of green's is decided, only its green may take the job's next generation
(`open_cutover`, used by `runtime.takeover.check_start`), so a retry of blue's task
cannot race green's claim. The record types are `checkpoints.cutover_records`'.
docs/PROTOCOL.md, "Zero-downtime cutover", has the whole protocol.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.cutover_records import (
    DECISIONS,
    MODES,
    OUTCOMES,
    SCHEMA_VERSION,
    CutoverAgreement,
    CutoverClaim,
    CutoverDecision,
    CutoverEnd,
    CutoverPlan,
    CutoverProgress,
    CutoverState,
    ProgressSighting,
    check_cutover_id,
    check_int,
    check_plan_bounds,
    new_cutover_id,
    sighting_of,
)
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, CutoverError, ObjectExists

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

# the record types are `checkpoints.cutover_records`'; re-exported: this is where callers find them
__all__ = ["DECISIONS", "MODES", "OUTCOMES", "SCHEMA_VERSION", "CutoverAgreement", "CutoverClaim",
           "CutoverDecision", "CutoverEnd", "CutoverPlan", "CutoverProgress", "CutoverState", "CutoverStore",
           "ProgressSighting", "check_plan_bounds", "new_cutover_id", "sighting_of"]


_PARSERS: dict[str, Any] = {"plan": CutoverPlan.from_json, "green": CutoverProgress.from_json,
                            "agreed": CutoverAgreement.from_json, "decision": CutoverDecision.from_json,
                            "claimed": CutoverClaim.from_json,
                            "done": CutoverEnd.from_json, "rollback": CutoverEnd.from_json}


class CutoverStore:
    """The cutover records of one job (see the module docstring)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.store = catalog.store

    # -- writing -------------------------------------------------------------------------

    def plan(self, plan: CutoverPlan) -> CutoverPlan:
        """Write `plan` (its id new).

        :raises CutoverError: another cutover of the job is open, or was planned at the same
            time (then this one is ended as aborted), or the id is taken.
        :raises ConfigError: the plan is for another job.
        """
        if plan.job != self.catalog.job:
            raise ConfigError(f"cutover plan {plan.id} is for job {plan.job!r}, not {self.catalog.job!r}")
        current = self.open_cutover()
        if current is not None:
            raise CutoverError(f"job {self.catalog.job!r} has cutover {current.id} open ({current.step}); "
                               "one cutover at a time: finish or call it off first")
        self._create(plan.id, "plan", plan.to_json())
        # The check and the write are two steps: a planner that finds another open plan
        # after its own write ends its own (both may; the orchestrator plans again), so at
        # most one goes on.
        other = self.open_cutover(besides=plan.id)
        if other is not None:
            why = f"cutover {other.id} was planned at the same time"
            self.end(plan.id, "aborted", step="plan", reason=why, by="plan")
            raise CutoverError(f"job {self.catalog.job!r}: {why} as {plan.id}; {plan.id} is called off "
                               "(one cutover at a time)")
        return plan

    def progress(self, progress: CutoverProgress) -> None:
        """Overwrite green's warm-up progress.

        :raises CutoverError: the cutover has no plan or is done.
        """
        self._require(progress.id, open_only=True)
        key = layout.cutover_key(progress.id, "green")
        body = json.dumps(progress.to_json(), sort_keys=True).encode()
        bounded.check_writable(body, layout.limits_of(key), f"{self.catalog.uri}/{key}")
        self.store.put(key, body)

    def agree(self, cutover_id: str, after_batch: int, request_id: str) -> CutoverAgreement:
        """Record the agreed batch N and blue's ``stop_after`` request.

        :raises CutoverError: no open plan, or already agreed.
        """
        self._require(cutover_id, open_only=True)
        faults.maybe_kill("cutover_agreement", after_batch)  # blue's request filed, not agreed yet
        agreement = CutoverAgreement(cutover_id, check_int(after_batch, "after_batch"), str(request_id),
                                     time.time())
        self._create(cutover_id, "agreed", agreement.to_json())
        return agreement

    def decide_claim(self, claim: CutoverClaim) -> CutoverDecision:
        """Green's side of the decision (after its generation claim and the checks after
        it, before its origin): returns the decision that stands, green's `claim` or a
        call-off's ``abort`` that came first (the caller then writes no origin).

        :raises CutoverError: not agreed, or ended without a decision (a call-off of a
            release before the decision record).
        """
        state = self.read(claim.id)
        if state.decision is not None:
            return state.decision
        self._require(claim.id, open_only=True)
        if state.agreed is None:
            raise CutoverError(f"cutover {claim.id} of job {self.catalog.job!r} is not agreed; "
                               "nothing to claim")
        return self._decide(CutoverDecision(claim.id, "claim", claim, at=time.time()))

    def claim(self, claim: CutoverClaim) -> CutoverClaim:
        """Record green's claim (after its origin), which its decision (`decide_claim`) names.

        :raises CutoverError: not agreed, done, already claimed, or decided otherwise.
        """
        state = self._require(claim.id, open_only=True)
        decided = state.decision
        if state.agreed is None or (decided is not None and decided.claim != claim):
            raise CutoverError(f"cutover {claim.id} of job {self.catalog.job!r} is not agreed or not decided "
                               f"for generation {claim.generation}; nothing to claim")
        self._create(claim.id, "claimed", claim.to_json())
        return claim

    def end(self, cutover_id: str, outcome: str, *, step: str, reason: str = "",
            generation: int | None = None, by: str = "") -> CutoverEnd:
        """End the cutover; the first end written holds, and is returned (a second writer
        gets the first's, so both see how it ended). ``aborted`` takes the ``abort``
        decision first (`decide_abort`), and ends as that decision says.

        :raises CutoverError: there is no such cutover, or (``aborted``) green's claim
            was decided first.
        """
        state = self._require(cutover_id, open_only=False)
        if outcome == "aborted" and state.done is None:
            decided = self.decide_abort(cutover_id, step=step, reason=reason, by=by)
            step, reason, by = decided.step or step, decided.reason, decided.by
        record = CutoverEnd(cutover_id, outcome, step, reason, generation, by, time.time())
        return self._write_once(cutover_id, "done", record)

    def decide_abort(self, cutover_id: str, *, step: str, reason: str, by: str) -> CutoverDecision:
        """The call-off's side of the decision (before it withdraws anything or ends the
        cutover): returns the ``abort`` that stands, this one or an earlier call-off's.

        :raises CutoverError: green's ``claim`` was decided first (it stands: the job is
            green's), no such cutover, or its records are unreadable.
        """
        state = self._require(cutover_id, open_only=False)
        decided = state.decision or self._decide(CutoverDecision(cutover_id, "abort", None, step, reason, by,
                                                                 time.time()))
        if decided.outcome != "abort":
            claim = decided.claim
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} was claimed by green "
                               f"(generation {claim.generation if claim else '?'}) before it was called off: "
                               "green's claim stands, it is green's job now (roll it back instead)")
        return decided

    def _decide(self, decision: CutoverDecision) -> CutoverDecision:
        try:
            self._create(decision.id, "decision", decision.to_json())
        except CutoverError:
            standing = self.read(decision.id).decision
            if standing is None:
                raise
            return standing
        return decision


    def roll_back(self, cutover_id: str, *, generation: int, reason: str = "", by: str = "",
                  restore: str | None = None) -> CutoverEnd:
        """Record that green's generation `generation` of a claimed cutover was rolled back
        (its uncommitted output aborted, the job's lineage returned before it: to
        `restore`). The done
        record stays (a committed cutover stays committed: what green committed before the
        rollback is visible); it is written as ``rolled_back`` when none was. Written once:
        a second rollback gets the first's record.

        :raises CutoverError: no such cutover, it was never claimed, or by a generation
            after `generation` (a later generation that continues green's lineage, a
            restart of green's, is rolled back as green: `cutover_lineage.cutover_of_lineage`).
        """
        state = self._require(cutover_id, open_only=False)
        if state.taken is None or state.taken.generation > generation:
            claimed = state.taken.generation if state.taken else None
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} was claimed by generation "
                               f"{claimed}, not by {generation} or a generation before it: nothing of it to "
                               "roll back")
        if state.rolled_back is not None:
            return state.rolled_back
        self.end(cutover_id, "rolled_back", step="rollback", reason=reason, generation=generation, by=by)
        record = CutoverEnd(cutover_id, "rolled_back", "rollback", reason, generation, by, time.time(),
                            restore)
        return self._write_once(cutover_id, "rollback", record)

    def _write_once(self, cutover_id: str, part: str, record: CutoverEnd) -> CutoverEnd:
        """Write end record `part` (``done`` or ``rollback``) once: a second writer gets
        the first's record.

        :raises CutoverError: it could not be written, and none is there.
        """
        try:
            self._create(cutover_id, part, record.to_json())
        except CutoverError:
            state = self.read(cutover_id)
            existing = state.done if part == "done" else state.rolled_back
            if existing is None:
                raise
            return existing
        return record

    # -- reading -------------------------------------------------------------------------

    def read(self, cutover_id: str) -> CutoverState:
        """Every record of cutover `cutover_id`.

        :raises CutoverError: it has no plan, or its plan is unreadable or another job's.
        """
        check_cutover_id(cutover_id)
        found: dict[str, Any] = {}
        errors = []
        for part, parse in _PARSERS.items():
            key = layout.cutover_key(cutover_id, part)
            try:
                found[part] = bounded.read_record(self.store, key, bounded.json_object(parse),
                                                  limits=layout.limits_of(key),
                                                  where=f"{self.catalog.uri}/{key}")
            except CorruptRecord as exc:
                if part in ("plan", "done", "decision"):  # whether it is open needs these
                    raise CutoverError(f"unreadable cutover record: {exc}") from None
                errors.append(str(exc))
                found[part] = None
        plan = found["plan"]
        if plan is None:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} has no plan under "
                               f"{self.catalog.uri}/{layout.CUTOVER}")
        if plan.id != cutover_id or plan.job != self.catalog.job:
            raise CutoverError(f"{self.catalog.uri}/{layout.cutover_key(cutover_id, 'plan')} holds cutover "
                               f"{plan.id!r} of job {plan.job!r}, not {cutover_id!r} of {self.catalog.job!r}")
        return CutoverState(plan, found["green"], found["agreed"], found["claimed"], found["done"],
                            tuple(errors), found["rollback"], found["decision"])

    def ids(self) -> list[str]:
        """Every cutover id with a plan, oldest first (one listing)."""
        ids = []
        for info in self.store.list(layout.CUTOVER):
            match = layout.CUTOVER_RE.match(info.key.rsplit("/", 1)[-1])
            if match and match.group(2) == "plan":
                ids.append(match.group(1))
        return sorted(ids)

    def newest(self, limit: int) -> list[CutoverState]:
        """The `limit` newest cutovers, newest first (one listing, then each one's records).

        :raises CutoverError: a plan or end record is unreadable (named).
        """
        return [self.read(cutover_id) for cutover_id in list(reversed(self.ids()))[:max(0, limit)]]

    def open_cutover(self, besides: str | None = None) -> CutoverState | None:
        """The open cutover of the job (a plan without a done record) other than
        `besides`, or None. Fails closed: an unreadable plan or end counts as open.

        :raises CutoverError: a cutover's plan or end is unreadable (named).
        """
        for cutover_id in reversed(self.ids()):  # the newest first: at most one is open
            if cutover_id == besides:
                continue
            state = self.read(cutover_id)
            if state.open:
                return state
        return None

    # -- the rules -----------------------------------------------------------------------

    def _require(self, cutover_id: str, *, open_only: bool) -> CutoverState:
        state = self.read(cutover_id)
        ended = state.ended
        if open_only and ended is not None:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} is done "
                               f"({ended.outcome} at {ended.step}: {ended.reason or 'no reason'})")
        return state

    def _create(self, cutover_id: str, part: str, body: Mapping[str, Any]) -> None:
        key = layout.cutover_key(cutover_id, part)
        data = json.dumps(body, sort_keys=True).encode()
        bounded.check_writable(data, layout.limits_of(key), f"{self.catalog.uri}/{key}")
        try:
            self.store.put_if_absent(key, data)
        except ObjectExists:
            raise CutoverError(f"cutover {cutover_id} of job {self.catalog.job!r} already has its {part} "
                               "record (written once)") from None
