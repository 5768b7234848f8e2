"""`SparkpointPreflightOperator`: before blue stops, can green read blue's state?

The restore drill of `SparkpointVerifyOperator` (one home: same scratch identity, same
replaced output arguments, same checks) run with *green's* application against *blue's*
newest completed checkpoint, while blue keeps running. Spark validates a stateful
operator's state schema when the restored query plans its first batch; so the drill
must run one: when nothing arrived since blue's newest checkpoint, the pre-flight drills
the checkpoint before it (green then replays blue's last batch, into scratch sinks).

Blue is never touched: no generation claim, no control request, no fence, and, unlike
a verify drill, no ``_verification.json`` next to blue's checkpoint (the outcome says
something about green's code, not about the checkpoint). A checkpoint that blue's
retention removes while the drill reads it is not green's fault: the pre-flight drills
blue's new newest one instead (at most `MAX_RETIRED` times). The use case is
`services.preflight.run_preflight`; this operator runs its drills through spark-submit.

With ``zero_downtime=True`` a passed pre-flight also plans the zero-downtime cutover
(`services.zero_downtime.plan_cutover`): green then warms up beside blue in a shadow
identity (its own task, the ``green_conf`` XCom added to its settings) and
`SparkpointCutoverOperator` hands the job over at an agreed batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError, SparkpointError
from airflow_sparkpoint.operators.job import positive_seconds
from airflow_sparkpoint.operators.verify import DrillFailed, SparkpointVerifyOperator
from airflow_sparkpoint.services.preflight import MAX_RETIRED, run_preflight
from airflow_sparkpoint.services.savepoint import requester
from airflow_sparkpoint.services.zero_downtime import check_plan_bounds, plan_cutover

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["MAX_RETIRED", "SparkpointPreflightOperator"]


class SparkpointPreflightOperator(SparkpointVerifyOperator):
    """Restore green's application from blue's newest completed checkpoint under a
    scratch identity; fail (with Spark's error) if it cannot, before anything stops blue.

    Put it upstream of the task that stops blue (``preflight >> stop_blue``): a failed
    pre-flight leaves blue running and the deploy ends there.

    :param job_name: blue's pipeline name (whose newest completed checkpoint is read).
    :param application: green's application; `application_args` green's arguments.
    :param output_args: green's output arguments, mapped to scratch locations (as for
        `SparkpointVerifyOperator`: ``{"--output": "{scratch}/out"}``).
    :param drill_job: the scratch pipeline name (default ``<job_name>-preflight``).
    :param zero_downtime: after a passed drill, plan a zero-downtime cutover of the running
        blue (default False: the stop-savepoint-start path). The result then has
        ``cutover`` (the plan) and the task pushes the XComs ``cutover_id`` and
        ``green_conf`` (the ``spark.sparkpoint.*`` settings green's submit adds:
        ``SparkpointSubmitOperator(sparkpoint_conf=XComArg(preflight, key="green_conf"))``).
    :param cutover_dir: where green's shadow keeps its scratch catalog (a path or URI
        green's driver reaches; a fresh ``<cutover_dir>/<cutover id>`` per cutover;
        default `drill_dir`; one of them is required with `zero_downtime`; templated).
    :param cutover_compare: the comparison gate: green's shadow output of every batch
        blue committed during the warm-up is compared with blue's, and the cutover is
        refused on the first difference (for a deploy that must not change results;
        append sinks only). Default False: green's shadow output is discarded.
    :param cutover_lag_batches: the agreement waits until green is at most this many
        batches behind blue (default 2).
    :param cutover_reach_timeout: bound of each step after the agreement (blue's stop,
        green's claim, green's first commit; a duration, default 10 minutes).

    Everything else as for `SparkpointVerifyOperator` (``drill_dir``, ``keep_scratch``,
    ``state_partitions`` to rehearse a rescale, ``conf``, ``conn_id``, ...), except
    ``snapshot``: always blue's newest completed checkpoint. Returns ``ok``, ``snapshot``,
    ``batch_id``, ``drill_job``, ``result`` (green's drill run) and ``tried`` (every
    checkpoint drilled, with why the pre-flight went on).

    :raises AirflowException: green could not restore the state ("pre-flight refused"),
        or no drill ran a batch, so the state was never read ("inconclusive").
    """

    template_fields: Sequence[str] = (*SparkpointVerifyOperator.template_fields, "cutover_dir")
    ui_color = "#fdf3e8"

    def __init__(self, *, job_name: str, output_args: Mapping[str, str], drill_job: str | None = None,
                 zero_downtime: bool = False, cutover_dir: str | None = None, cutover_compare: bool = False,
                 cutover_lag_batches: int = 2, cutover_reach_timeout: Any = 600, **kwargs: Any) -> None:
        if "snapshot" in kwargs:
            raise ConfigError("SparkpointPreflightOperator always drills blue's newest completed checkpoint; "
                              "remove snapshot= (SparkpointVerifyOperator drills a chosen snapshot)")
        kwargs.setdefault("name", f"sparkpoint-preflight-{job_name}")
        super().__init__(job_name=job_name, output_args=output_args, snapshot="latest",
                         drill_job=drill_job or f"{job_name}-preflight", **kwargs)
        self.zero_downtime = bool(zero_downtime)
        self.cutover_dir = cutover_dir or self.drill_dir
        if self.zero_downtime and not self.cutover_dir:
            raise ConfigError("zero_downtime=True needs cutover_dir (or drill_dir): where green's shadow "
                              "keeps its scratch catalog, a location green's driver reaches")
        self.cutover_mode = "compare" if cutover_compare else "discard"
        self.cutover_lag_batches = cutover_lag_batches
        self.cutover_reach_timeout = positive_seconds("cutover_reach_timeout", cutover_reach_timeout)
        # the service's rule, run here too so a bad bound fails the DAG's parse, not its run
        check_plan_bounds(mode=self.cutover_mode, lag_batches=self.cutover_lag_batches,
                          reach_timeout_s=self.cutover_reach_timeout)

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        catalog = self._production_catalog()
        try:
            passed = run_preflight(catalog, green=str(self.application),
                                   drill=lambda handle: self.drill(context, handle),
                                   storage_options=self.production_hook.storage_options,
                                   info=self.log.info, warn=self.log.warning)
        except DrillFailed as exc:
            raise AirflowException(str(exc)) from exc
        summary = passed.summary(self.drill_job)
        if self.zero_downtime:
            summary["cutover"] = self._plan_cutover(context, catalog)
        return summary

    def _plan_cutover(self, context: Context, catalog: Catalog) -> dict[str, Any]:
        """Plan the cutover (`plan_cutover`); push ``cutover_id`` and ``green_conf``.

        :raises AirflowException: blue does not run, cannot stop after a chosen batch, or
            another cutover is open (the message says which)."""
        try:
            start = plan_cutover(catalog, green_root=str(self.cutover_dir), mode=self.cutover_mode,
                                 lag_batches=self.cutover_lag_batches,
                                 reach_timeout_s=self.cutover_reach_timeout,
                                 requested_by=requester(f"airflow:{self.dag_id}.{self.task_id}"))
        except SparkpointError as exc:
            raise AirflowException(f"pre-flight passed, but the zero-downtime cutover cannot be planned: "
                                   f"{self.production_hook.scrub(str(exc))}") from exc
        plan = start.plan
        self.log.info("cutover %s planned: blue generation %d hands job %s over to green, warming up "
                      "from %s (batch %d) as %s in %s (%s; lag bound %d batches)", plan.id,
                      plan.blue_generation, plan.job, plan.warmup_uri, plan.warmup_batch, plan.green_job,
                      plan.green_root, plan.mode, plan.lag_batches)
        ti = context.get("ti")
        if ti is not None:
            ti.xcom_push(key="cutover_id", value=plan.id)
            ti.xcom_push(key="green_conf", value=start.settings)
        return start.to_json()
