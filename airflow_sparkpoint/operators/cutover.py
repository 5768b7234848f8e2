"""`SparkpointCutoverOperator`: drive a planned zero-downtime cutover to green's first commit.

An adapter: its arguments, one call of `services.zero_downtime.drive_cutover`, each
step in the task log, the outcome as XCom. Deferrable (``deferrable=True``): the same
steps (`services.zero_downtime.CutoverDriver`) with the waits in
`SparkpointCutoverTrigger`: the worker looks, acts (the agreement, the call-off) and
defers until the next look asks for more than waiting; a resumed task (a retry, a
worker lost) starts where the cutover's records stand. The cutover is planned by
`SparkpointPreflightOperator(zero_downtime=True)`; green runs in its own task
(`SparkpointSubmitOperator` with the pre-flight's ``green_conf``) beside this one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute, default_deferrable, positive_seconds
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink
from airflow_sparkpoint.services.cutover import call_off
from airflow_sparkpoint.services.runs import task_try
from airflow_sparkpoint.services.savepoint import requester
from airflow_sparkpoint.services.zero_downtime import (
    CutoverDriver,
    CutoverOutcome,
    DrivePosition,
    drive_cutover,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SparkpointCutoverOperator"]


class SparkpointCutoverOperator(BaseOperator):
    """Hand job `job_name` over from blue to green at an agreed batch (the zero-downtime
    path of a blue-green deploy, docs/howto/blue-green.md): wait until green's warm-up is
    within the plan's lag of blue, agree N ahead of blue, ask blue to stop after N, wait
    for blue's stop, green's claim and green's first commit. Returns ``cutover_id``,
    ``step`` (``committed``, or ``claimed`` when no input arrived since N), ``after_batch``,
    ``blue_generation``, ``green_generation``, ``blue_checkpoint``, ``seconds``, ``steps``.

    :param job_name: blue's pipeline (templated).
    :param cutover_id: the planned cutover (templated; the pre-flight's XCom ``cutover_id``).
    :param checkpoint_dir: storage root (templated); or `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection.
    :param cutover_within: how long green's warm-up may take to come within the plan's
        lag of blue (a duration; default 10 minutes); blue's stop, green's claim and its
        first commit are each bounded by the plan's reach timeout.
    :param margin: N = blue's newest batch + `margin` at the agreement (default 2).
    :param poll_interval: seconds between looks at the records (deferred: at least the
        triggers' 10 s).
    :param max_heartbeat_age: blue runs iff its heartbeat is younger than this.
    :param deferrable: wait in the triggerer, the worker slot free (default
        ``[operators] default_deferrable``); the writes stay in the worker. A task marked
        failed (or success) while deferred calls the cutover off unless green claimed (its
        trigger's `on_kill`), as a killed blocking task does; so does ``execution_timeout``;
        a cleared or retried task resumes the drive from the cutover's records.

    :raises AirflowTaskTimeout: deferred, ``execution_timeout`` passed (the cutover was
        called off unless green claimed).
    :raises AirflowException: the cutover was called off (before the agreement blue runs
        on untouched; after blue stopped, start blue again with ``restore=latest``), the
        comparison gate found a difference, or the cutover ended otherwise; the message says which.
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_dir", "cutover_id")
    ui_color = "#e8fdf0"
    operator_extra_links = (SparkpointCheckpointHistoryLink(),)
    sparkpoint_hook = JobHookAttribute()  # the job's store, as rendered
    hook = JobHookAttribute(alias=True)

    def __init__(self, *, job_name: str, cutover_id: str, checkpoint_dir: str | None = None,
                 sparkpoint_conn_id: str | None = None, cutover_within: timedelta | float | str = 600,
                 margin: int = 2, poll_interval: float = 2, max_heartbeat_age: float = 60,
                 deferrable: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        self.cutover_id = cutover_id
        self.cutover_within = positive_seconds("cutover_within", cutover_within)
        self.margin = margin
        self.poll_interval = positive_seconds("poll_interval", poll_interval)
        self.max_heartbeat_age = positive_seconds("max_heartbeat_age", max_heartbeat_age)
        self.deferrable = default_deferrable(deferrable)

    def _requester(self) -> str:
        return requester(f"airflow:{self.dag_id}.{self.task_id}")

    def execute(self, context: Context) -> dict[str, Any]:
        if self.deferrable:
            timeout = self.execution_timeout
            deadline = time.time() + timeout.total_seconds() if isinstance(timeout, timedelta) else None
            try:
                driver = self._driver()
                return self._drive(context, driver, driver.begin(time.time()), deadline)
            except SparkpointError as exc:
                raise AirflowException(self.hook.scrub(str(exc))) from exc
        try:
            outcome = drive_cutover(
                self.hook.get_catalog(self.job_name), str(self.cutover_id), within_s=self.cutover_within,
                margin=self.margin, poll_s=self.poll_interval, max_heartbeat_age=self.max_heartbeat_age,
                requested_by=self._requester(), on_step=self.log.info)
        except SparkpointError as exc:
            raise AirflowException(self.hook.scrub(str(exc))) from exc
        return outcome.to_json()

    def _driver(self) -> CutoverDriver:
        return CutoverDriver(self.hook.get_catalog(self.job_name), str(self.cutover_id),
                             within_s=self.cutover_within, requested_by=self._requester(), margin=self.margin,
                             poll_s=self.poll_interval, max_heartbeat_age=self.max_heartbeat_age,
                             on_step=self.log.info)

    def _drive(self, context: Context, driver: CutoverDriver, position: DrivePosition,
               deadline: float | None) -> dict[str, Any]:
        """Look and act until a look asks only for waiting (then defer) or the cutover is
        green's (its outcome)."""
        while True:
            now = time.time()
            seen = driver.look(position, now)
            position = driver.note(position, seen)
            if seen.action == "wait":
                self._defer(context, position, deadline)
            moved = driver.advance(position, seen, now)
            if isinstance(moved, CutoverOutcome):
                return moved.to_json()
            position = moved

    def _defer(self, context: Context, position: DrivePosition, deadline: float | None) -> NoReturn:
        from airflow_sparkpoint.triggers.cutover import SparkpointCutoverTrigger
        from airflow_sparkpoint.triggers.run import MIN_POLL_INTERVAL_S

        me = task_try(context, self.dag_id, self.task_id)
        task = {"dag_id": me.dag_id, "task_id": me.task_id, "run_id": me.run_id,
                "map_index": -1 if me.map_index is None else me.map_index}
        trigger = SparkpointCutoverTrigger(
            job_name=self.job_name, cutover_id=str(self.cutover_id), position=position.to_json(),
            checkpoint_dir=self.checkpoint_dir, sparkpoint_conn_id=self.sparkpoint_conn_id, task=task,
            poll_interval=max(self.poll_interval, MIN_POLL_INTERVAL_S),
            max_heartbeat_age=self.max_heartbeat_age,
            deadline=deadline, requested_by=self._requester())
        self.log.info("cutover %s: %s; deferring", self.cutover_id, position.phase)
        self.defer(trigger=trigger, method_name="execute_complete",
                   kwargs={"position": position.to_json(), "deadline": deadline})

    def execute_complete(self, context: Context, event: Any = None, *, position: Any = None,
                         deadline: float | None = None) -> dict[str, Any]:
        """The trigger fired: look again here and act (the event, untrusted, only says
        why it fired), or end on ``execution_timeout`` as a killed task does.

        :raises AirflowTaskTimeout: ``execution_timeout`` passed while deferred.
        :raises AirflowException: as `execute`, or a malformed event.
        """
        if not isinstance(event, dict) or event.get("cutover_id") != str(self.cutover_id):
            raise AirflowException(f"cutover {self.cutover_id}: the trigger's event {event!r} is not this "
                                   "cutover's; expected a dict naming it")
        self.log.info("cutover %s: the trigger fired (%s): %s", self.cutover_id, event.get("status"),
                      event.get("message"))
        if event.get("status") == "timeout":
            self._call_off_unless_claimed(f"task {self.task_id} passed its execution_timeout while deferred")
            raise AirflowTaskTimeout(self.hook.scrub(str(event.get("message"))))
        try:
            return self._drive(context, self._driver(), DrivePosition.from_json(position), deadline)
        except SparkpointError as exc:
            raise AirflowException(self.hook.scrub(str(exc))) from exc

    def on_kill(self) -> None:
        """Call the cutover off unless green claimed it already (then it is green's)."""
        self._call_off_unless_claimed(f"task {self.task_id} was killed while driving it")

    def _call_off_unless_claimed(self, reason: str) -> None:
        try:
            end = call_off(self.hook.get_catalog(self.job_name), str(self.cutover_id), reason=reason,
                           by=self._requester())
            self.log.info("cutover %s: %s at %s", end.id, end.outcome, end.step)
        except SparkpointError as exc:
            self.log.warning("cutover %s not called off: %s", self.cutover_id, exc)
