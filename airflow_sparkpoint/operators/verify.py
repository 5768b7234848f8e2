"""`SparkpointDrillOperator` (earlier name `SparkpointVerifyOperator`, kept working): a
full restore drill of a production snapshot — the application itself runs. (``sparkpoint
verify`` restores a snapshot's state *without* the application: a lighter check.)

Submits the pipeline's own application (a `SparkpointSubmitOperator`: same parameters,
same spark-submit) restored from a snapshot of the production job, under a scratch
identity: its own ``spark.sparkpoint.dir`` (a fresh directory under `drill_dir`) and
``spark.sparkpoint.job`` (`drill_job`), output arguments pointing at scratch locations
(`output_args`), ``restore.allowForeignJob=true`` and ``trigger=availableNow``. It runs
until it has caught up, checks that it finished from that snapshot, and records the
outcome next to the production snapshot (``_verification.json``, level ``drill``:
``sparkpoint list --json`` shows ``verified_at`` / ``verify_error``). A failed drill is
recorded, then raised, so the task fails and its ``on_failure_callback`` notifiers fire.

The drill never claims a generation of the production job and never writes to its
sinks: every output argument the DAG author names is replaced, and the drill's sink
transactions are keyed by the drill's job name.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
from airflow_sparkpoint.operators.job import JobHook
from airflow_sparkpoint.operators.submit import SparkpointSubmitOperator
from airflow_sparkpoint.services import drill as drills
from airflow_sparkpoint.services.drill import LATEST_SAVEPOINT, SCRATCH, DrillFailed
from airflow_sparkpoint.services.submit_try import DrillSettings, SubmitSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.services.sinks import Sink

__all__ = ["LATEST_SAVEPOINT", "SCRATCH", "DrillFailed", "SparkpointDrillOperator",
           "SparkpointVerifyOperator"]


class SparkpointDrillOperator(SparkpointSubmitOperator):
    """Restore drill: run the application from a production snapshot under a scratch
    identity and record whether it restored (see the module docstring). Returns a summary
    (``ok``, ``snapshot``, ``batch_id``, ``verified_at``, ``drill_job``, ``result``).

    :param job_name: the production pipeline whose snapshot is drilled.
    :param checkpoint_dir: the production storage root; or `sparkpoint_conn_id` (its S3
        settings and credentials serve the drill too).
    :param snapshot: ``latest`` (what ``restore=latest`` would use), ``latest_savepoint``
        (the newest complete savepoint: a damaged one fails the drill rather than being
        skipped), or a snapshot URI, path or key under the job root.
    :param output_args: application arguments to replace, e.g.
        ``{"--output": "{scratch}/alerts"}``: every argument through which the
        application writes. ``{scratch}`` stands for the drill's own directory. Required;
        each must be among `application_args`.
    :param drill_dir: where drills take their fresh directory (a path or ``s3://`` URI;
        default: the worker's temporary directory). On a cluster use storage the
        executors see. Spark's live location of the drill is a fresh directory under
        `work_dir` when it is set (the location every executor sees), else
        ``<its directory>/live`` (an ``s3://`` `drill_dir` then needs `work_dir`): never
        the production job's.
    :param drill_job: the drill's pipeline name (default ``<job_name>-drill``).
    :param keep_scratch: keep the drill's directory afterwards (default: deleted).

    Everything else is passed to `SparkpointSubmitOperator` (``application``,
    ``application_args``, ``conf``, ``conn_id``, ``ship_runtime``, ...), except
    ``restore``, ``trigger`` and ``commit_mode``, which the drill fixes. With
    ``state_partitions`` the drill restores the snapshot rescaled (a rehearsal of a
    rescale); its run then starts one batch later, after the repartitioner's batch.
    """

    template_fields: Sequence[str] = (
        *SparkpointSubmitOperator.template_fields, "snapshot", "output_args", "drill_dir", "drill_job",
    )
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        job_name: str,
        output_args: Mapping[str, str],
        snapshot: str = "latest",
        drill_dir: str | None = None,
        drill_job: str | None = None,
        keep_scratch: bool = False,
        **kwargs: Any,
    ) -> None:
        drills.check_parameters(type(self).__name__, kwargs, output_args)
        kwargs.setdefault("name", f"sparkpoint-drill-{job_name}")
        super().__init__(job_name=job_name, restore="latest", trigger="availableNow",
                         commit_mode="checkpoint", emit_asset_events=False, **kwargs)
        self.output_args = dict(output_args)
        self.snapshot = snapshot
        self.drill_dir = drill_dir
        self.drill_job = drill_job or f"{job_name}-drill"
        self.keep_scratch = keep_scratch
        self._scratch: drills.Scratch | None = None  # the drill's own directory, while it runs
        self._snapshot_uri: str | None = None
        self._drill_hook = JobHook()  # the hook of the drill's scratch root

    @property
    def _drill_root(self) -> str | None:
        return self._scratch.root if self._scratch is not None else None

    @property
    def _drill_work(self) -> str | None:
        return self._scratch.work if self._scratch is not None else None

    def declared_output(self) -> Sink | None:
        """A drill writes to scratch locations only: no output asset, no OpenLineage output."""
        return None

    # ------------------------------------------------------------------ identities

    @property
    def production_hook(self) -> SparkpointHook:
        """The production job's hook: the submit operator's `sparkpoint_hook`, which the
        drill's replaces."""
        return super().sparkpoint_hook

    # replaces the submit operator's `JobHookAttribute`, which mypy reads as writable
    @property
    def sparkpoint_hook(self) -> SparkpointHook:  # type: ignore[override]
        """The drill's storage (its scratch root with the production connection's S3
        settings): everything the submit operator derives from it is the drill's."""
        if self._drill_root is None:
            raise ConfigError("the drill's scratch directory is chosen in execute()")
        return self._drill_hook.of(self.sparkpoint_conn_id, self._drill_root)

    def _catalog(self) -> Catalog:
        # The drill's catalog: its generations, results and control channel (on_kill
        # stops the drill, never the production job).
        return self.sparkpoint_hook.get_catalog(self.drill_job)

    def _submit_settings(self) -> SubmitSettings:
        """The submit's settings as the drill's (`services.submit_try.DrillSettings`): every
        try restores the drilled snapshot under the drill's identity."""
        return DrillSettings.of(super()._submit_settings(), snapshot=self._snapshot_uri,
                                drill_job=self.drill_job, work=self._drill_work)

    # ------------------------------------------------------------------ execute

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        hook = self.production_hook
        outcome = drills.run_drill(
            self._production_catalog(), self.snapshot, drill_job=self.drill_job,
            storage_options=hook.storage_options, scrub=hook.scrub,
            verified_by=f"airflow:{self.dag_id}.{self.task_id}@{socket.gethostname()}",
            drill=lambda handle: self.drill(context, handle))
        if outcome.error is not None:
            raise AirflowException(outcome.error)
        self.log.info("restore drill of %s passed in %.1f s: %s", outcome.snapshot, outcome.duration_s,
                      outcome.checks)
        return outcome.summary()

    def _production_catalog(self) -> Catalog:
        drills.check_drill_job(self.job_name, self.drill_job)
        return self.production_hook.get_catalog(self.job_name)

    def drill(self, context: Context, handle: SnapshotHandle) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Run the application from `handle` once, in a fresh scratch directory (removed
        afterwards unless `keep_scratch`); returns the checks and the run result.

        Leaves the operator's own settings as they were, so a caller may drill again.

        :raises DrillFailed: the application failed or did not finish from `handle`
            (the message carries the job's own error when it recorded one).
        """
        saved = (self.application_args, self.conf, self.env_vars, self.py_files)
        self._snapshot_uri = handle.uri
        checks: dict[str, Any] = {"snapshot_batch": handle.metadata.batch_id}
        try:
            self._prepare_scratch()
            self.application_args = self._drill_arguments()
            self.log.info("restore drill of %s (batch %d) as job %s under %s", handle.uri,
                          handle.metadata.batch_id, self.drill_job, self._drill_root)
            try:
                result = super().execute(context)
            except AirflowException as exc:
                raise DrillFailed(f"the application failed: {exc}") from exc
            checks.update(self._check_result(result, handle))
            return checks, result
        finally:
            self._remove_scratch()
            self.application_args, self.conf, self.env_vars, self.py_files = saved
            self.sparkpoint_run = None  # the next drill finds its own run

    def _prepare_scratch(self) -> None:
        self._scratch = drills.Scratch.create(self.drill_dir, self.work_dir)

    def _remove_scratch(self) -> None:
        scratch = self._scratch
        if scratch is None or self.keep_scratch:
            return
        scratch.remove(storage_options=self.sparkpoint_hook.storage_options, work_dir=self.work_dir)

    def _drill_arguments(self) -> list[str]:
        """`application_args` with every output argument pointed at the scratch directory.

        :raises ConfigError: an output argument is not among the application's arguments.
        """
        assert self._scratch is not None
        return drills.drill_arguments(self.application_args, self.output_args, self._scratch.root)

    def _check_result(self, result: dict[str, Any] | None, handle: SnapshotHandle) -> dict[str, Any]:
        """:raises DrillFailed: the run did not finish from `handle` after its batch."""
        return drills.check_result(result, handle)


class SparkpointVerifyOperator(SparkpointDrillOperator):
    """The earlier name of `SparkpointDrillOperator`: the same operator, kept working.

    It runs the whole application (a drill), which the CLI's ``sparkpoint verify`` does
    not; new DAGs use `SparkpointDrillOperator`, whose name says so.
    """
