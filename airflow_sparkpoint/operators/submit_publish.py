"""What a submit task publishes about its run, attached or deferred: the run it started
(its generation claim, once) as XCom ``generation`` and ``spark_application``, and the
links' XComs. Bookkeeping never fails the run: a push that fails is logged."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from airflow_sparkpoint.operators.links import (
    SparkpointCheckpointHistoryLink,
    SparkpointSparkUILink,
    checkpoint_history_url,
    spark_ui_url,
)
from airflow_sparkpoint.services.runs import GenerationInfo, claim_json

__all__ = ["Publishing", "found", "push", "push_history_link"]


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
