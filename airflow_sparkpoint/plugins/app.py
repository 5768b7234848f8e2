"""The FastAPI app of the UI plugin, mounted by Airflow's API server at ``/sparkpoint``.

Airflow mounts a plugin's app as it is, so every route here depends on Airflow's
authentication (`airflow.api_fastapi.core_api.security.get_user`: the UI's session cookie
or a bearer token from ``POST /auth/token``), and each pipeline route on the user's access
to it (`pipelines.can_read`). There are no docs or OpenAPI routes. Routes::

    GET /pipelines                       HTML list of the pipelines the user may read
    GET /pipelines/{conn_id}/{job}       HTML checkpoints page (operators' extra links)
    GET /dags/{dag_id}                   HTML list of the pipelines one DAG uses (DAG tab)
    GET /api/pipelines                   JSON list
    GET /api/pipelines/{conn_id}/{job}   JSON history (`PipelineHistory.to_json()`)
    GET /metrics                         Prometheus text of every readable pipeline

Errors: 401 without a user, 403 without access, 404 for a pipeline no ``sparkpoint``
connection lists, 502 when its store cannot be read (the message names no secret).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from airflow_sparkpoint.checkpoints.health import prometheus_text
from airflow_sparkpoint.checkpoints.history import PipelineHistory, load_history
from airflow_sparkpoint.plugins import page
from airflow_sparkpoint.plugins.pipelines import (
    Pipeline,
    PipelineNotFound,
    can_read,
    dags_of,
    list_pipelines,
    open_catalog,
    redact,
    resolve,
)

log = logging.getLogger(__name__)


def _user_dependency() -> Any:
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


User = Annotated[Any, Depends(_user_dependency())]


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _readable(user: Any, pipeline: Pipeline) -> tuple[bool, tuple[str, ...]]:
    dags = dags_of(pipeline)
    return can_read(user, pipeline, dags), dags


def _load(user: Any, conn_id: str, job: str) -> tuple[Pipeline, PipelineHistory]:
    """The pipeline's history, after checking that it exists and that `user` may read it.

    :raises HTTPException: 404 unknown pipeline, 403 no access, 502 unreadable store.
    """
    try:
        pipeline = resolve(conn_id, job)
    except PipelineNotFound as exc:
        raise HTTPException(404, f"not a Sparkpoint pipeline: {exc}") from None
    try:
        catalog = open_catalog(pipeline)
        if not can_read(user, pipeline, dags_of(pipeline, catalog)):
            raise HTTPException(403, "Forbidden")
        return pipeline, load_history(catalog)
    except HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - a storage client's error; shown without secrets
        log.warning("cannot read pipeline %s/%s: %s", conn_id, job, type(exc).__name__)
        raise HTTPException(502, redact(f"cannot read the store of pipeline {conn_id}/{job}: "
                                        f"{type(exc).__name__}: {exc}", pipeline)) from None


def _visible(user: Any, dag_id: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for pipeline in list_pipelines():
        readable, dags = _readable(user, pipeline)
        if readable and (dag_id is None or dag_id in dags):
            rows.append({"conn_id": pipeline.conn_id, "job": pipeline.job, "dags": list(dags)})
    return rows


def create_app() -> FastAPI:
    """The plugin's app (no docs routes: everything it serves needs a user)."""
    app = FastAPI(title="Sparkpoint checkpoints", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _errors(request: Request, exc: HTTPException) -> Response:
        if "/api/" in request.url.path or request.url.path.endswith("/metrics"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        heading = {401: "Not authenticated", 403: "Forbidden", 404: "Not found"}.get(exc.status_code, "Error")
        return HTMLResponse(page.message_page(heading, str(exc.detail), _base(request)), status_code=exc.status_code,
                            headers=exc.headers)

    @app.get("/pipelines", response_class=HTMLResponse)
    def pipelines_page(request: Request, user: User) -> str:
        return page.pipeline_list(_visible(user), _base(request))

    @app.get("/dags/{dag_id}", response_class=HTMLResponse)
    def dag_page(request: Request, dag_id: str, user: User) -> str:
        return page.pipeline_list(_visible(user, dag_id), _base(request), dag_id=dag_id)

    @app.get("/pipelines/{conn_id}/{job}", response_class=HTMLResponse)
    def pipeline_page(request: Request, conn_id: str, job: str, user: User) -> str:
        pipeline, history = _load(user, conn_id, job)
        return page.pipeline_page(history.to_json(), pipeline.conn_id, _base(request))

    @app.get("/api/pipelines")
    def pipelines_json(user: User) -> dict[str, Any]:
        return {"pipelines": _visible(user)}

    @app.get("/api/pipelines/{conn_id}/{job}")
    def pipeline_json(conn_id: str, job: str, user: User) -> dict[str, Any]:
        pipeline, history = _load(user, conn_id, job)
        return {"conn_id": pipeline.conn_id, **history.to_json()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(user: User) -> PlainTextResponse:
        samples = []
        for row in _visible(user):
            try:
                _pipeline, history = _load(user, row["conn_id"], row["job"])
            except HTTPException as exc:
                log.warning("metrics: skipping pipeline %s/%s (%s)", row["conn_id"], row["job"], exc.status_code)
                continue
            samples.append(({"conn_id": row["conn_id"], "job": row["job"]}, history))
        return PlainTextResponse(prometheus_text(samples), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
