"""What a submit task publishes about its run, attached or deferred: the run it started
(its generation claim, once) as XCom ``generation`` and ``spark_application``, the links'
XComs, and at the run's end its result (the task's return value), checkpoint metrics and
output asset event. Bookkeeping never fails the run: a push that fails is logged."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from airflow_sparkpoint.operators.links import (
    SparkpointCheckpointHistoryLink,
    SparkpointSparkUILink,
    checkpoint_history_url,
    spark_ui_url,
)
from airflow_sparkpoint.operators.metrics import emit_metrics_for
from airflow_sparkpoint.services.runs import GenerationInfo, claim_json, committed_batches, read_result

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.operators.asset_events import AssetEvents
    from airflow_sparkpoint.services.sinks import Sink
    from airflow_sparkpoint.services.stores import Catalog

__all__ = ["Finishing", "Publishing", "finish", "found", "push", "push_history_link"]


class Publishing(Protocol):
    """What `found` and `push_history_link` use of the submit operator."""

    job_name: str
    sparkpoint_conn_id: str | None
    checkpoint_dir: str | None
    spark_history_server: str | None
    sparkpoint_run: dict[str, Any] | None

    @property
    def log(self) -> Any: ...


def found(op: Publishing, ti: Any, run: GenerationInfo | None) -> None:
    """Record the run this try started (once) and publish its generation and links."""
    with _FOUND_LOCK:
        if run is None or op.sparkpoint_run is not None:
            return
        op.sparkpoint_run = claim_json(run)
    op.log.info("job %s runs as generation %d (application %s, UI %s)", op.job_name, run.generation,
                run.app or "?", run.ui or "off")
    push(op, ti, "generation", run.generation)
    push(op, ti, "spark_application", op.sparkpoint_run)
    push(op, ti, SparkpointSparkUILink().xcom_key, spark_ui_url(op.sparkpoint_run, op.spark_history_server))


class Finishing(Protocol):
    """What `finish` uses of the submit operator."""

    job_name: str
    sparkpoint_result: dict[str, Any] | None
    _asset_events: AssetEvents

    @property
    def log(self) -> Any: ...

    def declared_output(self) -> Sink | None: ...


def finish(op: Finishing, context: Context, catalog: Catalog, generation: int) -> dict[str, Any] | None:
    """The end of a run that claimed `generation`, attached or deferred: its checkpoint
    metrics (through Airflow's Stats), and its run result, returned (the task's XCom), kept
    as the operator's ``sparkpoint_result`` (OpenLineage) and announced as the output asset's
    event when it committed batches; None (logged) when the run left no result."""
    result = read_result(catalog, generation)
    emit_metrics_for(catalog, every=0)  # never raises
    if result is None:
        op.log.warning("job %s generation %d ended without a Sparkpoint run result", op.job_name, generation)
        return None
    op.log.info("job %s generation %s %s: last batch %s, last checkpoint %s, savepoint %s", op.job_name,
                result.get("generation"), result.get("status"), result.get("last_batch"),
                result.get("last_checkpoint"), result.get("savepoint"))
    op.sparkpoint_result = result
    op._asset_events.emit_output(context, catalog, op.declared_output(), generation=generation,
                                 batches=committed_batches(result), source="submit")
    return result


def push(op: Publishing, ti: Any, key: str, value: Any) -> None:
    """Push XCom `key` (nothing for an empty value; a failure is logged, not raised)."""
    if value in (None, ""):
        return
    try:
        ti.xcom_push(key=key, value=value)
    except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
        op.log.debug("could not push XCom %r: %s", key, exc)


def push_history_link(op: Publishing, ti: Any) -> None:
    """Publish the checkpoint history link's XCom (before the run starts)."""
    push(op, ti, SparkpointCheckpointHistoryLink().xcom_key,
         checkpoint_history_url(op.job_name, op.sparkpoint_conn_id, op.checkpoint_dir))


#: serializes `found` (the watcher thread and the task's own); module-level: a lock on
#: the operator would not survive its deep copies
_FOUND_LOCK = threading.Lock()
