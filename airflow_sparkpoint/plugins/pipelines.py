"""Which pipelines the UI plugin serves, and who may see each one.

A pipeline is a job served by a ``sparkpoint`` connection that lists it in its extra
(`airflow_sparkpoint.hooks.sparkpoint.declared_jobs`)::

    {"jobs": ["orders", "payments"]}                       # names only
    {"jobs": {"orders": {"dags": ["etl_orders"]}}}        # with the DAGs that use it

so the plugin reads only storage roots an administrator configured (never a path or bucket
from a request), with the connection's own credentials, which never leave the server.

Access (`can_read`) comes from declarations only, never from the store (its records are
written by drivers, and can be by anyone who may write to it). The user must be
authenticated, and

- when the connection declares DAGs for the pipeline, be allowed to read at least one of
  them (Airflow's auth manager, ``is_authorized_dag(GET)``);
- when it declares none, be allowed to read the connection itself.

It is decided from the connection alone, before anything is read from the store.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.layout import validate_job_name
from airflow_sparkpoint.exceptions import ConfigError, SparkpointError

log = logging.getLogger(__name__)

CONN_TYPE = "sparkpoint"
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$")


class PipelineNotFound(SparkpointError):
    """No ``sparkpoint`` connection serves this job (or the names are malformed)."""


@dataclass(frozen=True)
class Pipeline:
    conn_id: str
    job: str
    declared_dags: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"/pipelines/{self.conn_id}/{self.job}"


def _jobs(conn: Any) -> dict[str, tuple[str, ...]]:
    # the hook (airflow.sdk) is imported when first needed, not when Airflow loads plugins
    from airflow_sparkpoint.hooks.sparkpoint import declared_jobs

    return {job: declared.dags for job, declared in declared_jobs(_extra(conn)).items()}


def _extra(conn: Any) -> dict[str, Any]:
    try:
        value = conn.extra_dejson
    except Exception:  # noqa: BLE001 - an unparsable extra serves no pipeline
        return {}
    return value if isinstance(value, dict) else {}


def _connection(conn_id: str) -> Any:
    from airflow.models.connection import Connection

    return Connection.get_connection_from_secrets(conn_id)


def sparkpoint_connections() -> list[Any]:
    """``sparkpoint`` connections in the metadata database and in ``AIRFLOW_CONN_*``
    variables (secrets backends cannot be listed: name such a connection's pipelines by URL)."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found: dict[str, Any] = {}
    with create_session() as session:
        for conn in session.scalars(select(Connection).where(Connection.conn_type == CONN_TYPE)):
            session.expunge(conn)
            found[conn.conn_id] = conn
    for name, value in os.environ.items():
        if not name.startswith("AIRFLOW_CONN_"):
            continue
        conn_id = name[len("AIRFLOW_CONN_"):].lower()
        try:
            conn = Connection.from_json(value, conn_id=conn_id) if value.lstrip().startswith("{") else \
                Connection(conn_id=conn_id, uri=value)
        except Exception as exc:  # noqa: BLE001 - not ours to report; Airflow does
            log.debug("skipping %s: %s", name, type(exc).__name__)
            continue
        if conn.conn_type == CONN_TYPE:
            found.setdefault(conn_id, conn)
    return [found[k] for k in sorted(found)]


def list_pipelines() -> list[Pipeline]:
    """Every pipeline of every listable ``sparkpoint`` connection."""
    return [Pipeline(conn.conn_id, job, dags) for conn in sparkpoint_connections()
            for job, dags in sorted(_jobs(conn).items())]


def resolve(conn_id: str, job: str) -> Pipeline:
    """The pipeline `job` of connection `conn_id`.

    :raises PipelineNotFound: malformed names, no such ``sparkpoint`` connection, or the
        connection does not list the job.
    """
    if not isinstance(conn_id, str) or not CONN_ID_RE.match(conn_id):
        raise PipelineNotFound(f"connection id {conn_id!r} is malformed")
    try:
        validate_job_name(job)
    except ConfigError as exc:
        raise PipelineNotFound(str(exc)) from None
    try:
        conn = _connection(conn_id)
    except Exception:  # noqa: BLE001 - AirflowNotFoundException and backend errors alike
        raise PipelineNotFound(f"no connection {conn_id!r}") from None
    if conn.conn_type != CONN_TYPE:
        raise PipelineNotFound(f"connection {conn_id!r} is not a {CONN_TYPE} connection")
    jobs = _jobs(conn)
    if job not in jobs:
        raise PipelineNotFound(f"connection {conn_id!r} does not list job {job!r} in its extra 'jobs'")
    return Pipeline(conn_id, job, jobs[job])


def open_catalog(pipeline: Pipeline) -> Catalog:
    """The pipeline's catalog, through the provider's hook (the connection's credentials
    stay in the storage client). Call it only after `can_read`."""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    return SparkpointHook(pipeline.conn_id).get_catalog(pipeline.job)


def can_read(user: Any, pipeline: Pipeline) -> bool:
    """Whether `user` may see `pipeline` (see the module docstring); reads no store."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails, DagDetails
    from airflow.models.dag import DagModel

    manager = get_auth_manager()
    if pipeline.declared_dags:
        return any(
            manager.is_authorized_dag(method="GET", details=DagDetails(id=d, team_name=DagModel.get_team_name(d)),
                                      user=user)
            for d in pipeline.declared_dags
        )
    return bool(manager.is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=pipeline.conn_id),
                                                 user=user))


def redact(text: str, pipeline: Pipeline) -> str:
    """`text` without the connection's secrets (`SparkpointHook.scrub`): for error
    messages that might quote a storage client's configuration."""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    return SparkpointHook(pipeline.conn_id).scrub(text)
