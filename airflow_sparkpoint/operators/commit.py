"""`SparkpointCommitOperator`: the external two-phase-commit step.

Promotes the staged output of confirmed checkpoints and aborts what can never be
confirmed (`airflow_sparkpoint.services.commit.commit_pending`); or, with
`abort_generation`, aborts everything a generation staged (blue-green rollback:
green's output never becomes visible). Idempotent: every commit is keyed and checked
against the sink first, so a retry after a crash is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import ConfigError, GenerationRunning
from airflow_sparkpoint.hooks.sparkpoint import storage_connection
from airflow_sparkpoint.operators import lineage
from airflow_sparkpoint.operators.asset_events import AssetAliasAttribute, AssetEvents, AssetEventsAttribute
from airflow_sparkpoint.operators.job import JobHook, JobHookAttribute, positive_seconds
from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink
from airflow_sparkpoint.services.commit import commit_step
from airflow_sparkpoint.services.conditions import optional_int
from airflow_sparkpoint.services.rollback import abort_stopped_generation
from airflow_sparkpoint.services.sinks import SinkSpec, declared_sink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.services.sinks import Sink

__all__ = ["SparkpointCommitOperator"]


class SparkpointCommitOperator(BaseOperator):
    """Commit (or, for a generation, abort) a Sparkpoint job's staged output.

    :param job_name: the pipeline (templated).
    :param checkpoint_dir: storage root (templated); or `sparkpoint_conn_id`, whose
        S3 endpoint and credentials also reach the sinks.
    :param sparkpoint_conn_id: a ``sparkpoint`` connection (default ``sparkpoint_default`` when no
        `checkpoint_dir` is given).
    :param abort_generation: abort every uncommitted transaction staged by this
        generation instead of committing (templated; e.g. green's generation from XCom).
        Refused while that generation is still running.
    :param upto_batch: commit confirmed batches only up to this one (templated;
        write-audit-publish: the audited range).
    :param max_heartbeat_age: a generation with a fresher heartbeat is still running.
    :param sink: the job's sink: a `Sink` (e.g. ``DeltaSink("s3://b/t")``) or its config
        mapping with ``kind`` (``{"kind": "directory", "uri": "/data/out", "format": "json"}``).
        Transaction records for any other sink are refused. Without it, the sink the
        `sparkpoint_conn_id` connection declares for the job (extra
        ``{"jobs": {"<job>": {"sink": {...}}}}``) is used; without either, each record's own
        sink config is used, confined to that sink's root, and a warning recommends
        declaring it (docs/security.md, "The commit step's sink"). The declared sink also names the output
        asset and the OpenLineage output dataset.
    :param emit_asset_events: when the step committed batches, emit one event of the
        output asset (extra: job, generation, committed batches, sink version); a step that
        committed nothing (or aborted) emits none.

    Returns (XCom) the transaction ids by outcome: ``committed``, ``already``,
    ``aborted`` and ``pending``; with `abort_generation`, ``{"aborted": [...]}``.
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_dir", "abort_generation", "upto_batch")
    ui_color = "#e8fde9"
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
        abort_generation: int | str | None = None,
        upto_batch: int | str | None = None,
        max_heartbeat_age: float = 60,
        sink: SinkSpec | None = None,
        emit_asset_events: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_dir = checkpoint_dir
        self.sparkpoint_conn_id = storage_connection(checkpoint_dir, sparkpoint_conn_id)
        self._job_hook = JobHook()
        AssetEvents.declare(self, emit_asset_events)
        #: what the step made visible (OpenLineage facets), once it ran
        self.sparkpoint_outcome: dict[str, Any] | None = None
        self.abort_generation = abort_generation
        self.upto_batch = upto_batch
        self.max_heartbeat_age = positive_seconds("max_heartbeat_age", max_heartbeat_age)
        declared_sink(sink)  # a malformed declaration fails when the DAG is parsed
        self.sink = sink

    def declared_output(self) -> Sink | None:
        """The job's declared sink (`sink`, else the connection's ``jobs.<job>.sink``), or
        None (logged when a declaration is unusable)."""
        return self._asset_events.declared_output(self.sink)

    def execute(self, context: Context) -> dict[str, list[str]]:
        # Parsed after rendering; a non-number (e.g. a rendered "None") fails rather than
        # silently committing what was meant to be aborted.
        generation = optional_int("abort_generation", self.abort_generation, minimum=1)
        upto = optional_int("upto_batch", self.upto_batch, minimum=0)
        if generation is not None and upto is not None:
            raise ConfigError("abort_generation and upto_batch exclude each other: "
                              "abort a generation or commit")
        catalog = self.hook.get_catalog(self.job_name)
        options = self.hook.storage_options
        # The operator's declaration wins; else the connection's (`jobs.<job>.sink`).
        sink = self.sink if self.sink is not None else self.hook.declared_sink(self.job_name)
        if generation is not None:
            try:
                aborted = abort_stopped_generation(
                    catalog, generation, max_heartbeat_age=self.max_heartbeat_age,
                    how_to_stop="SparkpointSavepointOperator with stop=True", storage_options=options,
                    sink=sink)
            except GenerationRunning as exc:  # the generation is still running
                raise AirflowException(self.hook.scrub(str(exc))) from exc
            self.log.info("aborted %d transaction(s) of generation %d of job %s: %s",
                          len(aborted), generation, self.job_name, aborted)
            return {"aborted": list(aborted)}
        step = commit_step(catalog, storage_options=options, upto_batch=upto, sink=sink)
        outcome = step.outcome
        self.log.info("commit step of job %s: committed %s, already %s, aborted %s, pending %s",
                      self.job_name, outcome.get("committed"), outcome.get("already"), outcome.get("aborted"),
                      outcome.get("pending"))
        self.sparkpoint_outcome = {"generation": step.generation, "committed_batches": step.batches,
                                   "last_checkpoint": step.last_checkpoint}
        self._asset_events.emit_output(context, catalog, declared_sink(sink), generation=step.generation,
                                       batches=step.batches, txn_ids=step.landed, source="commit")
        return outcome

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the output dataset (the declared sink) and the ``sparkpoint`` run facet."""
        return lineage.commit_lineage(self)
