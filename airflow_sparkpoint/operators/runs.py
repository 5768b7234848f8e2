"""Which run is whose: the generation a submit started (found by its token), its result,
and the record a task keeps across its tries in Airflow's task state store.

A driver records the token of the submit that started it (``SPARKPOINT_SUBMITTER``)
in its generation claim, with its application id and UI URL. Reading "the newest
generation" instead would race with any other run of the job (a cleared task's
previous try, a retry, a blue-green rollback).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.records import AIRFLOW_CONTEXT_ENV, AirflowTry
from airflow_sparkpoint.checkpoints.run_result import read_run_result
from airflow_sparkpoint.exceptions import ObjectNotFound, SparkpointError

log = logging.getLogger(__name__)

#: the task state store key a submit task keeps its record under
TASK_STATE_KEY = "sparkpoint_submit"


def new_token() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RunClaim:
    """A generation's claim record, as the driver wrote it when it started."""

    generation: int
    app: str = ""
    ui: str = ""
    host: str = ""
    pid: int = 0
    started_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_claim(catalog: Catalog, token: str, *, after: int = 0) -> RunClaim | None:
    """The generation newer than `after` whose driver recorded `token`, or None."""
    numbers = sorted(int(name) for info in catalog.store.list(layout.GENERATIONS)
                     if (name := info.key.rsplit("/", 1)[-1]).isdigit() and int(name) > after)
    for generation in numbers:
        try:
            body = json.loads(catalog.store.get(layout.generation_key(generation)))
        except (ObjectNotFound, ValueError) as exc:
            log.debug("generation %d of job %s: unreadable claim (%s)", generation, catalog.job, exc)
            continue
        details = body.get("details") if isinstance(body, dict) else None
        if isinstance(details, dict) and details.get("submitter") == token:
            return RunClaim(generation=generation, app=str(details.get("app") or ""), ui=str(details.get("ui") or ""),
                            host=str(body.get("host") or ""), pid=int(body.get("pid") or 0),
                            started_at=float(body.get("started_at") or 0.0))
    return None


def run_status(catalog: Catalog, generation: int) -> dict[str, Any]:
    """The status record generation `generation` wrote (its own record; ``status.json``
    while it has none, a store written before per-generation records), or {}; the caller
    checks the record's generation.

    :raises StorageError: the store cannot be read.
    """
    return catalog.read_status(generation) or catalog.read_status() or {}


def reported_error(catalog: Catalog, token: str, *, after: int = 0) -> str | None:
    """The error the run of submit `token` recorded when it failed (its own status
    record, `run_status`), or None."""
    try:
        claim = find_claim(catalog, token, after=after)
        status = run_status(catalog, claim.generation) if claim is not None else {}
    except SparkpointError as exc:
        log.debug("cannot read the failed run of job %s: %s", catalog.job, exc)
        return None
    if claim is None or status.get("generation") != claim.generation or status.get("state") != "failed":
        return None
    error = status.get("error")
    return str(error) if error else None


def read_result(catalog: Catalog, generation: int) -> dict[str, Any] | None:
    """The run result generation `generation` recorded when it ended (its XCom form), or None.

    :raises CorruptMetadata: the record is unreadable.
    """
    result = read_run_result(catalog, generation)
    return None if result is None else result.to_json()


@dataclass(frozen=True)
class TaskRecord:
    """What a submit task keeps across its tries (Airflow 3.3+ task state store).

    `tokens` are the submit tokens of every try so far (the last is the latest try's);
    `since` is the newest generation before the first try, so a try's generation is
    looked for among newer ones only.
    """

    try_number: int
    restore: str
    tokens: tuple[str, ...]
    since: int

    def generations(self, catalog: Catalog) -> list[int]:
        """The generations the task's tries ran (a try that died before its driver claimed
        one has none), oldest first."""
        found = (find_claim(catalog, token, after=self.since) for token in self.tokens)
        return sorted(claim.generation for claim in found if claim is not None)

    @classmethod
    def load(cls, store: Any) -> TaskRecord | None:
        if store is None:
            return None
        try:
            raw = store.get(TASK_STATE_KEY)
            if isinstance(raw, str):
                raw = json.loads(raw)
            if not isinstance(raw, dict):
                return None
            return cls(int(raw["try_number"]), str(raw["restore"]), tuple(str(t) for t in raw["tokens"]),
                       int(raw["since"]))
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            log.warning("could not read the task state record %r: %s", TASK_STATE_KEY, exc)
            return None

    def save(self, store: Any) -> None:
        if store is None:
            return
        try:
            store.set(TASK_STATE_KEY, {**asdict(self), "tokens": list(self.tokens)})
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            log.warning("could not write the task state record %r: %s", TASK_STATE_KEY, exc)


def task_try(context: Any, dag_id: str, task_id: str) -> AirflowTry:
    """The task try `context` runs (its map index only when the task is mapped);
    `dag_id`/`task_id`: the operator's, where the task instance does not say."""
    ti = context["ti"]
    index = getattr(ti, "map_index", None)
    return AirflowTry(str(getattr(ti, "dag_id", None) or dag_id), str(getattr(ti, "task_id", None) or task_id),
                      str(context.get("run_id") or getattr(ti, "run_id", "") or ""),
                      int(getattr(ti, "try_number", 1) or 1),
                      int(index) if isinstance(index, int) and index >= 0 else None)


def starter_environment(starter: AirflowTry) -> dict[str, str]:
    """The driver's view of `starter` (`records.AIRFLOW_CONTEXT_ENV`): what Airflow exports
    to the task's environment, set here explicitly, plus the map index it does not export."""
    values = {"dag_id": starter.dag_id, "task_id": starter.task_id, "run_id": starter.run_id,
              "try_number": "" if starter.try_number is None else str(starter.try_number),
              "map_index": "" if starter.map_index is None else str(starter.map_index)}
    return {AIRFLOW_CONTEXT_ENV[name]: value for name, value in values.items() if value}
