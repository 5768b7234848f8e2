"""`SparkpointCutoverOperator`: drive a planned zero-downtime cutover to green's first commit.

An adapter: its arguments, one call of `services.zero_downtime.drive_cutover`, each
step in the task log, the outcome as XCom. The cutover is planned by
`SparkpointPreflightOperator(zero_downtime=True)`; green runs in its own task
(`SparkpointSubmitOperator` with the pre-flight's ``green_conf``) beside this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.operators.job_mixin import SparkpointJobMixin, positive_seconds
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink
from airflow_sparkpoint.services.cutover import call_off
from airflow_sparkpoint.services.savepoint import requester
from airflow_sparkpoint.services.zero_downtime import drive_cutover

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SparkpointCutoverOperator"]


class SparkpointCutoverOperator(SparkpointJobMixin, BaseOperator):
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
    :param poll_interval: seconds between looks at the records.
    :param max_heartbeat_age: blue runs iff its heartbeat is younger than this.

    :raises AirflowException: the cutover was called off (before the agreement blue runs
        on untouched; after blue stopped, start blue again with ``restore=latest``), the
        comparison gate found a difference, or the cutover ended otherwise; the message says which.
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_dir", "cutover_id")
    ui_color = "#e8fdf0"
    operator_extra_links = (SparkpointCheckpointHistoryLink(),)

    def __init__(self, *, job_name: str, cutover_id: str, checkpoint_dir: str | None = None,
                 sparkpoint_conn_id: str | None = None, cutover_within: timedelta | float | str = 600,
                 margin: int = 2, poll_interval: float = 2, max_heartbeat_age: float = 60,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._init_job(job_name, checkpoint_dir, sparkpoint_conn_id)
        self.cutover_id = cutover_id
        self.cutover_within = positive_seconds("cutover_within", cutover_within)
        self.margin = margin
        self.poll_interval = positive_seconds("poll_interval", poll_interval)
        self.max_heartbeat_age = positive_seconds("max_heartbeat_age", max_heartbeat_age)

    def execute(self, context: Context) -> dict[str, Any]:
        catalog = self.hook.get_catalog(self.job_name)
        try:
            outcome = drive_cutover(
                catalog, str(self.cutover_id), within_s=self.cutover_within, margin=self.margin,
                poll_s=self.poll_interval, max_heartbeat_age=self.max_heartbeat_age,
                requested_by=requester(f"airflow:{self.dag_id}.{self.task_id}"), on_step=self.log.info)
        except SparkpointError as exc:
            raise AirflowException(self.hook.scrub(str(exc))) from exc
        return outcome.to_json()

    def on_kill(self) -> None:
        """Call the cutover off unless green claimed it already (then it is green's)."""
        try:
            end = call_off(self.hook.get_catalog(self.job_name), str(self.cutover_id),
                           reason=f"task {self.task_id} was killed while driving it",
                           by=requester(f"airflow:{self.dag_id}.{self.task_id}"))
            self.log.info("cutover %s: %s at %s", end.id, end.outcome, end.step)
        except SparkpointError as exc:
            self.log.warning("cutover %s not called off: %s", self.cutover_id, exc)
