"""Which pipelines the UI plugin serves, and who may see each one.

A pipeline is a job under the storage root of a ``sparkpoint`` connection: one its extra
declares (`airflow_sparkpoint.hooks.sparkpoint.declared_jobs`)::

    {"jobs": ["orders", "payments"]}                       # names only
    {"jobs": {"orders": {"dags": ["etl_orders"]}}}        # with the DAGs that use it

or one the store holds (a top-level directory with a job's name), declared or not. The
plugin reads only storage roots an administrator configured (never a path or bucket from a
request), with the connection's own credentials, which never leave the server.

Access (`can_read`) comes from the connection and Airflow, never from the store (its
records are written by drivers, and can be by anyone who may write to it). The user must
be authenticated, and

- when the connection declares DAGs for the pipeline, be allowed to read at least one of
  them that Airflow knows (a DAG in its metadata database, not stale; Airflow's auth
  manager, ``is_authorized_dag(GET)``): a declaration narrows access to those DAGs' readers;
- else (declared without DAGs, or not declared at all), be allowed to read the connection.

It is decided before anything is read from the store. Listing the job names under a root
is a store read: it is done only for a user who may read the connection, who may see every
undeclared job there (`stored_jobs`); a writer of the store can add names to that list, and
so show a pipeline to those users only, never to anyone else.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.exceptions import ConfigError, PipelineNotFound
from airflow_sparkpoint.services.stores import Catalog, jobs_under, validate_job_name

__all__ = ["CONN_ID_RE", "CONN_TYPE", "MAX_STORED_JOBS", "Pipeline", "PipelineNotFound", "can_read",
           "known_dags", "list_pipelines", "may_read_connection", "open_catalog", "redact", "resolve",
           "sparkpoint_connections", "stored_jobs"]

log = logging.getLogger(__name__)

CONN_TYPE = "sparkpoint"
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$")
#: the most job names listed under one root (the first, by name): a store holds what its
#: writers put there
MAX_STORED_JOBS = 1000


@dataclass(frozen=True)
class Pipeline:
    """A job of connection `conn_id`: `declared` by its extra (with `declared_dags`), or
    found in its store only."""

    conn_id: str
    job: str
    declared_dags: tuple[str, ...] = ()
    declared: bool = True

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


def stored_jobs(conn_id: str) -> list[str]:
    """The job names under connection `conn_id`'s storage root (`services.stores.jobs_under`:
    its top-level directories with a valid job name; at most `MAX_STORED_JOBS`, the first
    by name). A store read: call it only for a user who may read the connection
    (`may_read_connection`).

    :raises StorageError: the root cannot be listed.
    """
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    names = []
    for name in jobs_under(SparkpointHook(conn_id).get_storage()):
        names.append(name)
        if len(names) >= MAX_STORED_JOBS:
            log.warning("connection %s: listing only the first %d jobs under its root", conn_id,
                        MAX_STORED_JOBS)
            break
    return names


def list_pipelines(user: Any, *, stored: bool = True) -> list[Pipeline]:
    """Every pipeline `user` may read (`can_read`), of every listable ``sparkpoint``
    connection: its declared jobs, and with `stored`, for a user who may read the
    connection, also the jobs its store holds (a root that cannot be listed adds none,
    with a warning)."""
    conns = sparkpoint_connections()
    declared = {conn.conn_id: _jobs(conn) for conn in conns}
    known = known_dags(d for jobs in declared.values() for dags in jobs.values() for d in dags)
    found = []
    for conn in conns:
        jobs = {job: Pipeline(conn.conn_id, job, dags) for job, dags in declared[conn.conn_id].items()}
        connection = may_read_connection(user, conn.conn_id)
        if connection and stored:
            try:
                for job in stored_jobs(conn.conn_id):
                    jobs.setdefault(job, Pipeline(conn.conn_id, job, declared=False))
            except Exception as exc:  # noqa: BLE001 - a storage client's error; the declared ones still show
                log.warning("cannot list the jobs under the root of connection %s: %s", conn.conn_id,
                            type(exc).__name__)
        found += [p for _job, p in sorted(jobs.items()) if _may_read(user, p, connection, known)]
    return found


def resolve(conn_id: str, job: str) -> Pipeline:
    """The pipeline `job` of connection `conn_id`: declared, or else (whether its store
    holds it is for the caller to check, after `can_read`) undeclared.

    :raises PipelineNotFound: malformed names or no such ``sparkpoint`` connection.
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
    return Pipeline(conn_id, job, jobs[job]) if job in jobs else Pipeline(conn_id, job, declared=False)


def open_catalog(pipeline: Pipeline) -> Catalog:
    """The pipeline's catalog, through the provider's hook (the connection's credentials
    stay in the storage client). Call it only after `can_read`."""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    return SparkpointHook(pipeline.conn_id).get_catalog(pipeline.job)


def known_dags(dag_ids: Iterable[str]) -> set[str]:
    """Those of `dag_ids` that Airflow knows: in its metadata database and not stale (a
    DAG whose file is gone may be claimed by whoever adds a DAG with its id)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    wanted = sorted(set(dag_ids))
    if not wanted:
        return set()
    with create_session() as session:
        return set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(wanted),
                                                                 DagModel.is_stale.is_(False))))


def may_read_connection(user: Any, conn_id: str) -> bool:
    """Whether the auth manager lets `user` read connection `conn_id`."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    return bool(get_auth_manager().is_authorized_connection(method="GET",
                                                            details=ConnectionDetails(conn_id=conn_id),
                                                            user=user))


def _may_read(user: Any, pipeline: Pipeline, connection: bool, known: set[str]) -> bool:
    """`can_read`, with the answer for the connection and the DAGs Airflow knows at hand."""
    if not pipeline.declared_dags:
        return connection
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    manager = get_auth_manager()
    return any(
        manager.is_authorized_dag(method="GET", details=DagDetails(id=d, team_name=DagModel.get_team_name(d)),
                                  user=user)
        for d in pipeline.declared_dags if d in known
    )


def can_read(user: Any, pipeline: Pipeline) -> bool:
    """Whether `user` may see `pipeline` (see the module docstring); reads no store."""
    connection = not pipeline.declared_dags and may_read_connection(user, pipeline.conn_id)
    return _may_read(user, pipeline, connection, known_dags(pipeline.declared_dags))


def redact(text: str, pipeline: Pipeline) -> str:
    """`text` without the connection's secrets (`SparkpointHook.scrub`): for error
    messages that might quote a storage client's configuration."""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    return SparkpointHook(pipeline.conn_id).scrub(text)
