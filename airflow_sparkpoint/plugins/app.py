"""The FastAPI app of the UI plugin, mounted by Airflow's API server at ``/sparkpoint``.

Airflow mounts a plugin's app as it is, so every route here depends on Airflow's
authentication (`airflow.api_fastapi.core_api.security.get_user`: the UI's session cookie
or a bearer token from ``POST /auth/token``), and each pipeline route on the user's access
to it (`pipelines.can_read`, decided from the connection before anything is read from the
store). There are no docs or OpenAPI routes. Routes::

    GET /pipelines                       HTML list of the pipelines the user may read
    GET /pipelines/{conn_id}/{job}       HTML checkpoints page (operators' extra links)
    GET /dags/{dag_id}                   HTML list of the pipelines one DAG uses (DAG tab)
    GET /api/pipelines                   JSON list
    GET /api/pipelines/{conn_id}/{job}   JSON history (`PipelineHistory.to_json()`)
    GET /metrics                         Prometheus text of every readable pipeline

Errors: 401 without a user; 404, one and the same answer, for a pipeline no ``sparkpoint``
connection declares or holds under its root and for one the user may not read (whether a
connection or a job exists is not told to who may not see it); 502 when the store of a
readable pipeline cannot be read (the message names no secret). Every response carries `SECURITY_HEADERS`: no
caching,
no MIME sniffing, a content security policy that allows only the page's own style and
framing by Airflow's own pages.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airflow_sparkpoint.plugins import page
from airflow_sparkpoint.plugins.pipelines import (
    Pipeline,
    PipelineNotFound,
    can_read,
    list_pipelines,
    open_catalog,
    redact,
    resolve,
)
from airflow_sparkpoint.services.health import load_for_metrics, prometheus_text
from airflow_sparkpoint.services.history import PipelineHistory, load_history

__all__ = ["NOT_FOUND", "SECURITY_HEADERS", "SecurityHeaders", "User", "create_app"]

log = logging.getLogger(__name__)


def _user_dependency() -> Any:
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


User = Annotated[Any, Depends(_user_dependency())]


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


#: the one answer for a pipeline that does not exist and one the user may not read
NOT_FOUND = "No such Sparkpoint pipeline, or you may not read it."

SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": page.CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeaders:
    """ASGI middleware: `SECURITY_HEADERS` on every response of the app (errors too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _load(user: Any, conn_id: str, job: str, *, metrics: bool = False) -> tuple[Pipeline, PipelineHistory]:
    """The pipeline's history (with `metrics`, what the metrics need: `load_for_metrics`),
    after checking that it exists and that `user` may read it (nothing is read from the
    store before).

    :raises HTTPException: 404 unknown or not readable pipeline (`NOT_FOUND`), 502
        unreadable store.
    """
    try:
        pipeline = resolve(conn_id, job)
    except PipelineNotFound as exc:
        log.debug("404 for pipeline %r/%r: %s", conn_id, job, exc)
        raise HTTPException(404, NOT_FOUND) from None
    if not can_read(user, pipeline):
        log.debug("404 for pipeline %s/%s: the user may not read it", conn_id, job)
        raise HTTPException(404, NOT_FOUND)
    try:
        catalog = open_catalog(pipeline)
        if not pipeline.declared and next(iter(catalog.store.list("")), None) is None:
            log.debug("404 for pipeline %s/%s: not declared, nothing stored", conn_id, job)
            raise HTTPException(404, NOT_FOUND)
        return pipeline, load_for_metrics(catalog) if metrics else load_history(catalog)
    except HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - a storage client's error; shown without secrets
        log.warning("cannot read pipeline %s/%s: %s", conn_id, job, type(exc).__name__)
        raise HTTPException(502, redact(f"cannot read the store of pipeline {conn_id}/{job}: "
                                        f"{type(exc).__name__}: {exc}", pipeline)) from None


def _visible(user: Any, dag_id: str | None = None) -> list[dict[str, Any]]:
    """The pipelines `user` may read (of DAG `dag_id`: those declaring it); lists only the
    roots of connections `user` may read (`pipelines.list_pipelines`)."""
    return [{"conn_id": p.conn_id, "job": p.job, "dags": list(p.declared_dags), "declared": p.declared}
            for p in list_pipelines(user, stored=dag_id is None)
            if dag_id is None or dag_id in p.declared_dags]


def create_app() -> FastAPI:
    """The plugin's app (no docs routes: everything it serves needs a user)."""
    app = FastAPI(title="Sparkpoint checkpoints", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(SecurityHeaders)

    @app.exception_handler(HTTPException)
    async def _errors(request: Request, exc: HTTPException) -> Response:
        if "/api/" in request.url.path or request.url.path.endswith("/metrics"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        heading = {401: "Not authenticated", 403: "Forbidden", 404: "Not found"}.get(exc.status_code, "Error")
        return HTMLResponse(page.message_page(heading, str(exc.detail), _base(request)),
                            status_code=exc.status_code, headers=exc.headers)

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
                _pipeline, history = _load(user, row["conn_id"], row["job"], metrics=True)
            except HTTPException as exc:
                log.warning("metrics: skipping pipeline %s/%s (%s)", row["conn_id"], row["job"],
                            exc.status_code)
                continue
            samples.append(({"conn_id": row["conn_id"], "job": row["job"]}, history))
        return PlainTextResponse(prometheus_text(samples),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
