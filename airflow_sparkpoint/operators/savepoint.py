"""`SparkpointSavepointOperator`: take a savepoint of a Sparkpoint job.

A running job (state running, fresh heartbeat) gets a control request: ``savepoint``,
or ``stop`` for stop-with-savepoint (the job stops between micro-batches, takes the
savepoint, commits and exits 0). A job that is not running gets a savepoint copied from
its latest completed checkpoint (unless `from_checkpoint_if_not_running` is False).
Afterwards, savepoint history retention (`max_count` / `max_age`) disposes of older
savepoints, always keeping the newest. Returns the savepoint URI.

The request names the running generation: only that run serves it. If the task is
killed while it waits (`on_kill`; deferred: the trigger's `on_kill`), a request no run
took yet is withdrawn, so no later run acts on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint import assets
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators import lineage
from airflow_sparkpoint.operators.asset_events import AssetAliasAttribute, AssetEvents, AssetEventsAttribute
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute, default_deferrable, positive_seconds
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink
from airflow_sparkpoint.services.conditions import optional_int, optional_seconds
from airflow_sparkpoint.services.control import ControlRequest, withdraw_request
from airflow_sparkpoint.services.savepoint import keep_savepoint_history, requester, take_savepoint
from airflow_sparkpoint.triggers.checkpoint import SparkpointCheckpointTrigger
from airflow_sparkpoint.triggers.shared import check_event

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SparkpointSavepointOperator"]


class SparkpointSavepointOperator(BaseOperator):
    """Savepoint (or stop-with-savepoint) of a Sparkpoint job; returns the savepoint URI.

    :param job_name: the pipeline (templated).
    :param checkpoint_dir: storage root (templated); or `sparkpoint_conn_id`.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection (default ``sparkpoint_default`` when no
        `checkpoint_dir` is given).
    :param stop: stop-with-savepoint: the running job stops after the savepoint.
    :param timeout: seconds to wait for the running job to complete the request.
    :param poll_interval: seconds between looks at the request.
    :param max_heartbeat_age: the job is running iff its state is running and its
        heartbeat is younger than this.
    :param from_checkpoint_if_not_running: with no running job, make the savepoint from
        the latest completed checkpoint; False fails instead.
    :param max_count: after success keep at most this many savepoints (newest first).
    :param max_age: after success dispose of savepoints older than this (timedelta or
        seconds). The newest savepoint is always kept.
    :param deferrable: wait for the request in the triggerer instead of a worker slot
        (default: ``[operators] default_deferrable``).
    :param emit_asset_events: emit one event of the job's savepoints asset
        (`airflow_sparkpoint.assets.savepoints_asset`; extra: job, generation, savepoint
        URI, batch) once the savepoint is complete.

    Durations are seconds, a timedelta or a duration string (``"10 minutes"``).
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_dir")
    ui_color = "#fdf2e8"
    operator_extra_links = (SparkpointCheckpointHistoryLink(),)
    sparkpoint_hook = JobHookAttribute()  # the job's store, as rendered
    hook = JobHookAttribute(alias=True)
    assets_alias = AssetAliasAttribute()
    _asset_events = AssetEventsAttribute()  # bound to the task it is read on
    emit_asset_events: bool  # set by `AssetEvents.declare`

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_dir: str | None = None,
        sparkpoint_conn_id: str | None = None,
        stop: bool = False,
        timeout: float = 600,
        poll_interval: float = 2,
        max_heartbeat_age: float = 60,
        from_checkpoint_if_not_running: bool = True,
        max_count: int | None = None,
        max_age: timedelta | float | str | None = None,
        deferrable: bool | None = None,
        emit_asset_events: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        AssetEvents.declare(self, emit_asset_events)
        #: the completed savepoint (asset event, OpenLineage facets)
        self.sparkpoint_savepoint: dict[str, Any] | None = None
        self.stop = bool(stop)
        self.timeout = positive_seconds("timeout", timeout)
        self.poll_interval = positive_seconds("poll_interval", poll_interval)
        self.max_heartbeat_age = positive_seconds("max_heartbeat_age", max_heartbeat_age)
        self.from_checkpoint_if_not_running = bool(from_checkpoint_if_not_running)
        self.max_count = optional_int("max_count", max_count, minimum=1)
        self.max_age = optional_seconds("max_age", max_age)
        self.deferrable = default_deferrable(deferrable)
        #: the control request this task filed (withdrawn by `on_kill` if no run took it)
        self.request_id: str | None = None

    def execute(self, context: Context) -> str:
        catalog = self.hook.get_catalog(self.job_name)
        try:
            done = take_savepoint(
                catalog, stop=self.stop, timeout_s=self.timeout, poll_s=self.poll_interval,
                max_heartbeat_age=self.max_heartbeat_age,
                requested_by=requester(f"airflow:{self.dag_id}.{self.task_id}"),
                refused_by=(None if self.from_checkpoint_if_not_running
                            else "from_checkpoint_if_not_running=False"),
                wait=not self.deferrable, on_request=self._filed, announce=self.log.info,
                max_count=self.max_count, max_age_s=self.max_age)
        except SparkpointError as exc:
            raise AirflowException(self.hook.scrub(str(exc))) from exc
        if done.state == "pending":  # deferrable: the trigger waits
            self.defer(
                trigger=SparkpointCheckpointTrigger(
                    mode="control_result", job_name=self.job_name, checkpoint_dir=self.checkpoint_dir,
                    sparkpoint_conn_id=self.sparkpoint_conn_id, request_id=done.request_id,
                    generation=done.generation, max_heartbeat_age=self.max_heartbeat_age,
                    poll_interval=self.poll_interval, deadline=time.time() + self.timeout),
                method_name="execute_complete",
                # The trigger's own deadline withdraws the request; this is the backstop.
                timeout=timedelta(seconds=self.timeout + 60),
            )
        if done.source == "running-job":
            self.log.info("generation %s of job %s completed savepoint %s (batch %s)", done.generation,
                          self.job_name, done.uri, done.batch_id)
        self._completed(context, done.generation, str(done.uri), done.batch_id,
                        last_checkpoint=done.checkpoint_uri)
        return str(done.uri)

    def _filed(self, request: ControlRequest) -> None:
        """Remember the request (`on_kill` withdraws it while no run took it)."""
        self.request_id = request.id
        self.log.info("asked generation %d of job %s for a %s (request %s, timeout %.0f s)",
                      request.generation, self.job_name, "stop-with-savepoint" if self.stop else "savepoint",
                      request.id, self.timeout)

    def on_kill(self) -> None:
        """Withdraw this task's control request if no run has taken it yet (a run that
        took it finishes it: a savepoint completes, a stop stops)."""
        if self.request_id is None:
            return
        try:
            result = withdraw_request(self.hook.get_catalog(self.job_name), self.request_id,
                                      f"task {self.task_id} was killed while waiting")
        except SparkpointError as exc:
            self.log.warning("could not withdraw control request %s of job %s: %s", self.request_id,
                             self.job_name, exc)
            return
        self.log.info("control request %s of job %s is %s", self.request_id, self.job_name, result.state)

    def execute_complete(self, context: Context, event: Any = None) -> str:
        """Resume after the trigger: apply retention and return the savepoint URI.

        :raises AirflowException: an error event or a malformed one.
        """
        payload = check_event(event, required=("savepoint_uri",))
        self.log.info("generation %s of job %s completed savepoint %s (batch %s)", payload.get("generation"),
                      self.job_name, payload["savepoint_uri"], payload.get("batch_id"))
        self._completed(context, payload.get("generation"), str(payload["savepoint_uri"]),
                        payload.get("batch_id"))
        keep_savepoint_history(self.hook.get_catalog(self.job_name), max_count=self.max_count,
                               max_age_s=self.max_age)
        return str(payload["savepoint_uri"])

    def _completed(self, context: Context, generation: Any, savepoint: str, batch_id: Any,
                   last_checkpoint: str | None = None) -> None:
        """Record the savepoint (OpenLineage) and emit the savepoints asset's event."""
        generation = int(generation) if isinstance(generation, int) else None
        batch = int(batch_id) if isinstance(batch_id, int) else None
        self.sparkpoint_savepoint = {"generation": generation, "savepoint": savepoint, "batch": batch,
                                     "last_checkpoint": last_checkpoint}
        asset = assets.savepoints_asset(self.job_name, sparkpoint_conn_id=self.sparkpoint_conn_id,
                                        checkpoint_dir=self.checkpoint_dir)
        extra = assets.savepoint_extra(job=self.job_name, generation=generation, savepoint_uri=savepoint,
                                       batch_id=batch, source="savepoint")
        self._asset_events.emit(context, asset, extra)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the savepoints dataset and the ``sparkpoint`` run facet."""
        return lineage.savepoint_lineage(self)
