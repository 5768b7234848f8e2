"""Which snapshot a try of a submit task restores: ``restore`` on the first try, the
latest retained checkpoint of the task's own tries on a retry (resume, never restart,
never another run's state), a hand-chosen ``restore_snapshot`` on every try; and the
record a task keeps across its tries (Airflow 3.3+'s task state store) to know which
generations were its own. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, open_snapshot
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.exceptions import ConfigError, RestoreError
from airflow_sparkpoint.services.runs import find_claim, new_token, run_status
from airflow_sparkpoint.services.submit import check_start, start_rule

__all__ = ["TASK_STATE_KEY", "TaskRecord", "TryPlan", "choose_restore", "chosen_snapshot", "plan_try",
           "restore_decision"]

log = logging.getLogger(__name__)

#: the task state store key a submit task keeps its record under
TASK_STATE_KEY = "sparkpoint_submit"


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
        """The record in Airflow's task state `store` (None: no store, no record, or an
        unreadable one, logged)."""
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

    def save(self, store: Any, *, retention: Any = None) -> None:
        """Write the record to `store` (nothing without one; a failure is logged), kept for
        `retention` (Airflow's ``NEVER_EXPIRE`` for a job that may run past the store's
        default 30 days; None: the store's default)."""
        if store is None:
            return
        try:
            value = {**asdict(self), "tokens": list(self.tokens)}
            if retention is None:
                store.set(TASK_STATE_KEY, value)
            else:
                store.set(TASK_STATE_KEY, value, retention=retention)
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            log.warning("could not write the task state record %r: %s", TASK_STATE_KEY, exc)


def chosen_snapshot(value: Any) -> str | None:
    """`restore_snapshot` as a path, or None when not set (None or blank).

    :raises ConfigError: ``latest``/``none`` or not a string (those are `restore` values).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or value.strip().lower() in ("latest", "none"):
        raise ConfigError(f"restore_snapshot={value!r} is invalid; expected a savepoint "
                          "or checkpoint path (see "
                          "`sparkpoint list`), or empty; 'latest' and 'none' are values of restore=")
    return value.strip()


def choose_restore(
    try_number: int,
    *,
    restore: str,
    restore_snapshot: Any = None,
    catalog: Catalog | None = None,
    own_generations: Sequence[int] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """``restore`` on the first try; on a retry, the latest retained checkpoint of the
    task's own tries (resume, never restart).

    `restore_snapshot`, when set, on every try (a hand-chosen restore).

    ``restore="latest"``/``"none"``: a retry restores ``latest``. A savepoint or
    checkpoint path: a retry restores the newest checkpoint that one of the task's
    tries completed (``latest`` when that is the job's newest, else its path), or the
    same path again while none did — never another run's state. `own_generations`
    (from the task state record, Airflow 3.3+) are the generations the task's tries
    ran; without them, a checkpoint newer than the path counts as the task's own.

    :raises ConfigError: `restore_snapshot` is not a path.
    """
    chosen = chosen_snapshot(restore_snapshot)
    if chosen is not None:
        return chosen
    if try_number <= 1:
        return restore
    if restore in ("latest", "none") or catalog is None:
        return "latest"
    latest = catalog.latest()
    if latest is None:
        return restore
    if own_generations is not None:
        own = [meta for meta in catalog.checkpoints() if meta.generation in set(own_generations)]
        if not own:
            return restore
        newest = max(own, key=lambda meta: meta.id)
        return "latest" if newest.id == latest.id else catalog.checkpoint_uri(newest.id)
    try:
        target = open_snapshot(restore, storage_options=dict(storage_options or {})).metadata
    except RestoreError:
        return "latest"
    return restore if latest.created_at <= target.created_at else "latest"


def restore_decision(catalog: Catalog, *, job: str, task: str, try_number: int, restore: str, chosen: str,
                     hand_chosen: bool, previous: TaskRecord | None) -> list[str]:
    """What a try restores and why, as lines for the task log: `chosen` (`choose_restore`'s
    answer for `try_number`, where the task's `restore` is the first try's; `hand_chosen`
    with a `restore_snapshot`), and, on a retry with the task's record, how the previous
    try's run ended.

    :raises StorageError: the store cannot be read.
    """
    if hand_chosen:
        return [(f"try {try_number}: job {job} restores {chosen} (restore_snapshot: a hand-chosen restore, "
                 "honoured on every try)")]
    if try_number <= 1:
        return [f"first try: job {job} starts with restore={chosen}"]
    lines = []
    if previous is not None:
        run = find_claim(catalog, previous.tokens[-1], after=previous.since)
        status = run_status(catalog, run.generation) if run is not None else None
        if run is None:
            lines.append(f"try {try_number}: the previous try ({previous.try_number}) "
                         f"started no run of job {job}")
        elif status is not None:
            lines.append(f"try {try_number}: the previous try ({previous.try_number}) ran "
                         f"generation {run.generation}"
                         f", which ended {status.state}" + (f" ({status.error})" if status.error else ""))
    if chosen == "latest":
        lines.append(f"try {try_number} of {task}: resuming job {job} from its latest retained checkpoint "
                     f"(restore=latest; the first try's restore={restore!r} is not used again)")
    elif chosen == restore:
        lines.append(f"try {try_number} of {task}: no try of this task completed a "
                     f"checkpoint of job {job} yet; "
                     f"restoring {chosen} again")
    else:
        lines.append(f"try {try_number} of {task}: resuming job {job} from {chosen}, the "
                     "newest checkpoint of this "
                     "task's own tries (a newer one is another run's)")
    return lines


@dataclass(frozen=True)
class TryPlan:
    """What a try of a submit task starts from: the task's record of its earlier tries
    (`previous`, None on a first try or without a task state store), the newest generation
    before this try (`since`: its run is looked for among newer ones), the generations the
    earlier tries ran (`own`, None when not known), the restore target chosen and the log
    lines that say why (`lines`)."""

    try_number: int
    previous: TaskRecord | None
    since: int
    own: list[int] | None
    restore: str
    lines: list[str]

    def start(self, catalog: Catalog, starter: AirflowTry, *, takeover: bool, settings: Mapping[str, str],
              store: Any, retention: Any = None) -> str:
        """Start this try: refuse it while another task's run is live (`check_start`; the
        driver checks again, the same rule, before its claim), then record its new submit
        token in the task's record. Returns the token.

        :raises JobAlreadyRunning: another task's run is live and not `takeover`.
        :raises CutoverInProgress: a cutover of the job is open.
        """
        check_start(catalog, starter, takeover=takeover, **start_rule(settings))
        token = new_token()
        previous = self.previous
        TaskRecord(self.try_number, self.restore, (*(previous.tokens if previous else ()), token),
                   previous.since if previous else self.since).save(store, retention=retention)
        return token


def plan_try(catalog: Catalog, store: Any, *, try_number: int, job: str, task: str, restore: str,
             restore_snapshot: Any, choose: Callable[[int, Catalog, list[int] | None], str]) -> TryPlan:
    """What try `try_number` of task `task` restores (`choose`: `choose_restore` with the
    task's parameters, or a drill's own choice), from the task's record in `store` (read on
    a retry) and the catalog, with the log lines that say why (`restore_decision`).

    :raises ConfigError: `restore_snapshot` is not a path.
    :raises StorageError: the store cannot be read.
    """
    previous = TaskRecord.load(store) if try_number > 1 else None
    since = catalog.current_generation()
    own = previous.generations(catalog) if previous is not None else None
    chosen = choose(try_number, catalog, own)
    lines = restore_decision(catalog, job=job, task=task, try_number=try_number, restore=restore,
                             chosen=chosen, previous=previous,
                             hand_chosen=chosen_snapshot(restore_snapshot) is not None)
    return TryPlan(try_number, previous, since, own, chosen, lines)
