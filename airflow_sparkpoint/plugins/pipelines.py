"""Which pipelines the UI plugin serves, and who may see each one.

A pipeline is a job served by a ``sparkpoint`` connection that lists it in its extra::

    {"jobs": ["orders", "payments"]}                       # names only
    {"jobs": {"orders": {"dags": ["etl_orders"]}}}        # with the DAGs that use it

so the plugin reads only storage roots an administrator configured (never a path or bucket
from a request), with the connection's own credentials, which never leave the server.

Access (`can_read`): the user must be authenticated, and

- when the DAGs that use the pipeline are known, be allowed to read at least one of them
  (Airflow's auth manager, ``is_authorized_dag(GET)``). The DAGs are those the connection
  declares plus those whose tasks started its newest generations (the runtime records the
  Airflow task context of a client-mode driver in the generation record);
- when none is known, be allowed to read the connection itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.history import generation_records
from airflow_sparkpoint.checkpoints.layout import validate_job_name
from airflow_sparkpoint.exceptions import ConfigError, SparkpointError

log = logging.getLogger(__name__)

CONN_TYPE = "sparkpoint"
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$")
#: seconds the DAGs of a pipeline (read from its generation records) are cached
DAGS_TTL = 30.0


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


def jobs_of(extra: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The jobs a connection's extra lists, each with the DAGs it declares (see the module
    docstring). Malformed names are skipped with a warning."""
    raw = extra.get("jobs")
    items: Iterable[tuple[Any, Any]]
    if isinstance(raw, str):
        items = ((name.strip(), None) for name in raw.split(",") if name.strip())
    elif isinstance(raw, Mapping):
        items = raw.items()
    elif isinstance(raw, (list, tuple)):
        items = ((name, None) for name in raw)
    else:
        return {}
    jobs: dict[str, tuple[str, ...]] = {}
    for name, spec in items:
        try:
            job = validate_job_name(str(name))
        except ConfigError as exc:
            log.warning("ignoring a job listed by a sparkpoint connection: %s", exc)
            continue
        dags = spec.get("dags", ()) if isinstance(spec, Mapping) else ()
        jobs[job] = tuple(str(d) for d in (dags if isinstance(dags, (list, tuple)) else [dags]) if d)
    return jobs


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
            for job, dags in sorted(jobs_of(_extra(conn)).items())]


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
    jobs = jobs_of(_extra(conn))
    if job not in jobs:
        raise PipelineNotFound(f"connection {conn_id!r} does not list job {job!r} in its extra 'jobs'")
    return Pipeline(conn_id, job, jobs[job])


def open_catalog(pipeline: Pipeline) -> Catalog:
    """The pipeline's catalog, through the provider's hook (the connection's credentials
    stay in the storage client)."""
    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

    return SparkpointHook(pipeline.conn_id).get_catalog(pipeline.job)


_dag_cache: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}
_dag_lock = threading.Lock()


def dags_of(pipeline: Pipeline, catalog: Catalog | None = None) -> tuple[str, ...]:
    """The DAGs known to use the pipeline: declared ones and those that started its newest
    generations (cached for `DAGS_TTL` seconds)."""
    key = (pipeline.conn_id, pipeline.job)
    now = time.monotonic()
    with _dag_lock:
        cached = _dag_cache.get(key)
    if cached is not None and now - cached[0] < DAGS_TTL:
        return cached[1]
    recorded: set[str] = set()
    try:
        for record in generation_records(catalog or open_catalog(pipeline)):
            if record.airflow is not None:
                recorded.add(record.airflow.dag_id)
    except Exception as exc:  # noqa: BLE001 - an unreadable store: only the declared DAGs count
        log.warning("cannot read the generations of pipeline %s/%s: %s", pipeline.conn_id, pipeline.job,
                    type(exc).__name__)
    dags = tuple(sorted({*pipeline.declared_dags, *recorded}))
    with _dag_lock:
        _dag_cache[key] = (now, dags)
    return dags


def can_read(user: Any, pipeline: Pipeline, dags: Iterable[str]) -> bool:
    """Whether `user` may see `pipeline` (see the module docstring)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails, DagDetails
    from airflow.models.dag import DagModel

    manager = get_auth_manager()
    dag_ids = list(dags)
    if dag_ids:
        return any(
            manager.is_authorized_dag(method="GET", details=DagDetails(id=d, team_name=DagModel.get_team_name(d)),
                                      user=user)
            for d in dag_ids
        )
    return bool(manager.is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=pipeline.conn_id),
                                                 user=user))


def redact(text: str, pipeline: Pipeline) -> str:
    """`text` with the connection's secrets (login, password, extra values) replaced: for
    error messages that might quote a storage client's configuration."""
    try:
        conn = _connection(pipeline.conn_id)
    except Exception:  # noqa: BLE001
        return text
    secrets = [conn.login, conn.password, *[json.dumps(v) if not isinstance(v, str) else v
                                             for v in _extra(conn).values() if isinstance(v, (str, int))]]
    for secret in secrets:
        if secret and isinstance(secret, str) and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text
