"""Extra links of the Sparkpoint operators (declared in the provider info).

* **Checkpoint history** — for a job whose storage comes from a ``sparkpoint``
  connection, the Sparkpoint UI page ``/sparkpoint/pipelines/<conn_id>/<job>`` under
  Airflow's ``[api] base_url``; for a job given by ``checkpoint_dir`` only, its storage
  location (the AWS console, an S3-compatible endpoint, or ``file://``).
* **Spark UI** (`SparkpointSubmitOperator`) — the run's application on the Spark
  History Server when ``spark_history_server`` is set, else the driver's live UI, both
  from what the driver recorded when it claimed its generation (application id, UI URL).

Airflow 3 computes a link in the task process when the task ends and stores it as an
XCom; the submit operator also pushes both while its job runs, so a long-running
streaming task shows them at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["UI_PATH", "SparkpointCheckpointHistoryLink", "SparkpointSparkUILink", "airflow_url",
           "checkpoint_history_url", "spark_ui_url"]

UI_PATH = "/sparkpoint/pipelines/{conn_id}/{job}"


def airflow_url(path: str) -> str:
    """`path` under Airflow's ``[api] base_url`` (relative when it is not set)."""
    from airflow.sdk import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return base.rstrip("/") + path


def checkpoint_history_url(job_name: Any, conn_id: Any, checkpoint_dir: Any) -> str:
    """The link target for a job's checkpoint history ("" when it cannot be known)."""
    job = str(job_name or "")
    if not job or "{{" in job:
        return ""
    if conn_id:
        return airflow_url(UI_PATH.format(conn_id=quote(str(conn_id), safe=""), job=quote(job, safe="")))
    if not checkpoint_dir or "{{" in str(checkpoint_dir):
        return ""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    try:
        return SparkpointHook(None, storage_uri=str(checkpoint_dir)).location_url(job)
    except Exception:  # noqa: BLE001 - a link must never fail a task
        return ""


def spark_ui_url(run: dict[str, Any] | None, history_server: str | None) -> str:
    """The Spark UI of a recorded run ("" when it is not known)."""
    if not run:
        return ""
    app = str(run.get("app") or "")
    if history_server and app:
        return f"{history_server.rstrip('/')}/history/{quote(app, safe='')}/"
    return str(run.get("ui") or "")


class SparkpointCheckpointHistoryLink(BaseOperatorLink):
    """The job's checkpoints and savepoints (the Sparkpoint UI, or the storage location)."""

    name = "Checkpoint history"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return checkpoint_history_url(getattr(operator, "job_name", None),
                                      getattr(operator, "sparkpoint_conn_id", None),
                                      getattr(operator, "checkpoint_dir", None))


class SparkpointSparkUILink(BaseOperatorLink):
    """The Spark application of the task's run (History Server, or the live UI)."""

    name = "Spark UI"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return spark_ui_url(getattr(operator, "sparkpoint_run", None),
                            getattr(operator, "spark_history_server", None))
