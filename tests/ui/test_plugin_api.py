"""The plugin's routes on a real Airflow API server: authentication on every route, access
by the DAGs a connection declares for a pipeline (DAGs Airflow knows), else by the
connection, never by what the store says, checked before anything is read from the store;
every job under a connection's root shown to who may read the connection; one 404 for "no
such pipeline" and "not yours"; security headers on every response; validated path
parameters, no secret in any response, the JSON equal to `sparkpoint list --json`,
Prometheus metrics, and a pipeline on S3."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.ui_stack import FORGED_DAG, SECRETS, Stack

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3, pytest.mark.timeout(1200)]

ROUTES = ["/sparkpoint/pipelines", "/sparkpoint/pipelines/sp_local/ui_totals", "/sparkpoint/dags/open_dag",
          "/sparkpoint/api/pipelines", "/sparkpoint/api/pipelines/sp_local/ui_totals", "/sparkpoint/metrics",
          "/sparkpoint/pipelines/sp_s3/s3_job"]


def get(stack: Stack, path: str, user: str | None = None, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {stack.token(user)}"} if user else {}
    return httpx.get(f"{stack.url}{path}", headers=headers, timeout=120, **kw)  # type: ignore[arg-type]


def assert_no_secret(response: httpx.Response) -> None:
    body = response.text
    for secret in SECRETS:
        assert secret not in body, f"{response.request.url} leaks {secret!r}"
    for value in response.headers.values():
        assert not any(secret in value for secret in SECRETS)


@pytest.mark.parametrize("path", [*ROUTES, "/sparkpoint/docs", "/sparkpoint/openapi.json"])
def test_every_route_needs_an_authenticated_user(ui_stack: Stack, path: str) -> None:
    response = get(ui_stack, path)
    assert response.status_code in (401, 403, 404), (path, response.status_code)
    if path not in ("/sparkpoint/docs", "/sparkpoint/openapi.json"):  # those do not exist at all
        assert response.status_code in (401, 403)
    forged = httpx.get(f"{ui_stack.url}{path}", headers={"Authorization": "Bearer not-a-token"}, timeout=60)
    assert forged.status_code in (401, 403, 404)
    cookie = httpx.get(f"{ui_stack.url}{path}", cookies={"_token": "forged"}, timeout=60)
    assert cookie.status_code in (401, 403, 404)
    assert_no_secret(response)


def test_access_follows_the_dags_the_connection_declares(ui_stack: Stack) -> None:
    # ui_totals: used by open_dag (readable by a viewer); hidden: used by secret_dag (denied
    # to non-admins); lonely: no DAG declared, so access to the connection decides (op and up).
    # A pipeline a user may not read is answered like one that does not exist (404).
    assert get(ui_stack, "/sparkpoint/pipelines/sp_local/ui_totals", "viewer").status_code == 200
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/hidden", "viewer").status_code == 404
    assert get(ui_stack, "/sparkpoint/pipelines/sp_local/hidden", "op").status_code == 404
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/hidden", "admin").status_code == 200
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/lonely", "viewer").status_code == 404
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/lonely", "op").status_code == 200
    listed = {p["job"] for p in get(ui_stack, "/sparkpoint/api/pipelines", "viewer").json()["pipelines"]}
    assert listed == {"ui_totals"}  # s3_job has no declared DAG and viewers cannot read connections
    every = {p["job"] for p in get(ui_stack, "/sparkpoint/api/pipelines", "admin").json()["pipelines"]}
    # not ghost: see below
    assert every == {"ui_totals", "lonely", "hidden", "s3_job", "trapped", "plain_job"}
    metrics = get(ui_stack, "/sparkpoint/metrics", "viewer").text
    assert 'job="ui_totals"' in metrics and 'job="hidden"' not in metrics


def test_a_forged_generation_record_grants_nothing(ui_stack: Stack) -> None:
    """``lonely`` (no DAG declared) and ``hidden`` (declared: secret_dag) carry generation
    records claiming a start by a task of open_dag, which the viewer may read: the store
    is written by drivers (and by anyone who can write to it), so it never widens access."""
    admin = get(ui_stack, "/sparkpoint/api/pipelines/sp_local/lonely", "admin").json()
    assert FORGED_DAG in admin["dag_ids"], "the forged record is in the store (and shown to who may read it)"
    for path in ("/sparkpoint/api/pipelines/sp_local/lonely", "/sparkpoint/api/pipelines/sp_local/hidden",
                 "/sparkpoint/pipelines/sp_local/lonely", "/sparkpoint/pipelines/sp_local/hidden"):
        response = get(ui_stack, path, "viewer")
        assert response.status_code == 404, (path, response.status_code, response.text[:300])
    listed = get(ui_stack, "/sparkpoint/api/pipelines", "viewer").json()["pipelines"]
    assert [p["job"] for p in listed] == ["ui_totals"]
    tab = get(ui_stack, f"/sparkpoint/dags/{FORGED_DAG}", "viewer").text
    assert "lonely" not in tab and "hidden" not in tab and "ui_totals" in tab
    metrics = get(ui_stack, "/sparkpoint/metrics", "viewer").text
    assert 'job="lonely"' not in metrics and 'job="hidden"' not in metrics


def test_access_is_checked_before_anything_is_read_from_the_store(ui_stack: Stack) -> None:
    """``trapped`` lives on an S3 endpoint that records every request: nothing a viewer
    asks for (the pipeline itself, the lists, the DAG tab, the metrics) reaches it, while
    an admin's request for the same pipeline does (so the trap is on the path)."""
    trap = ui_stack.trap
    before = len(trap.requests)
    for path in ("/sparkpoint/api/pipelines/sp_trap/trapped", "/sparkpoint/pipelines/sp_trap/trapped",
                 "/sparkpoint/api/pipelines", "/sparkpoint/pipelines", "/sparkpoint/dags/secret_dag",
                 "/sparkpoint/metrics"):
        response = get(ui_stack, path, "viewer")
        assert trap.requests[before:] == [], f"{path} read the store of a pipeline the viewer may not read"
        assert response.status_code in (200, 404), (path, response.status_code)
    response = get(ui_stack, "/sparkpoint/api/pipelines/sp_trap/trapped", "admin")
    assert response.status_code == 502, response.text  # the trap denies every request
    assert len(trap.requests) > before, "the admin's request never reached the store: the trap proves nothing"
    assert_no_secret(response)


def test_every_job_under_a_connections_root_is_shown_to_who_may_read_the_connection(ui_stack: Stack) -> None:
    """``sp_plain`` declares no job, as the tutorial's connection: its root's jobs are
    listed and served to a user who may read the connection (op), after that check, and to
    no one else (viewer); the operator's Checkpoint history link (this route) opens."""
    listed = get(ui_stack, "/sparkpoint/api/pipelines", "op").json()["pipelines"]
    plain = [p for p in listed if p["conn_id"] == "sp_plain"]
    assert plain == [{"conn_id": "sp_plain", "job": "plain_job", "dags": [], "declared": False}], listed
    assert "hidden" not in {p["job"] for p in listed}, \
        "a declaration for DAGs narrows, also for connection readers"
    page = get(ui_stack, "/sparkpoint/pipelines", "op").text
    assert "plain_job" in page and "No pipeline to show" not in page
    history = get(ui_stack, "/sparkpoint/api/pipelines/sp_plain/plain_job", "op")
    assert history.status_code == 200 and history.json()["generation"] == 1, history.text
    assert get(ui_stack, "/sparkpoint/pipelines/sp_plain/plain_job", "op").status_code == 200
    assert "plain_job" not in get(ui_stack, "/sparkpoint/api/pipelines", "viewer").text
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_plain/plain_job", "viewer").status_code == 404
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_plain/not_there", "op").status_code == 404


def test_a_declared_dag_grants_access_only_when_airflow_knows_it(ui_stack: Stack) -> None:
    """``ghost`` is declared for ``ghost_dag``, which no DAG file defines: whoever could
    later add a DAG with that id must not inherit the pipeline, so no one sees it now (not
    even an admin, whom the auth manager would let read any DAG id)."""
    for user in ("viewer", "op", "admin"):
        listed = {p["job"] for p in get(ui_stack, "/sparkpoint/api/pipelines", user).json()["pipelines"]}
        assert "ghost" not in listed, (user, listed)
        assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/ghost", user).status_code == 404, user
    # open_dag known
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/ui_totals", "viewer").status_code == 200


NOT_FOUND = [
    "/sparkpoint/api/pipelines/no_such_conn/ui_totals",  # no such connection
    "/sparkpoint/api/pipelines/spark_default/ui_totals",  # not a sparkpoint connection
    "/sparkpoint/api/pipelines/sp_local/not_listed",  # the connection does not serve the job
    "/sparkpoint/api/pipelines/sp_local/ghost",  # declared for a DAG Airflow does not know
    "/sparkpoint/api/pipelines/sp_plain/plain_job",  # stored, the viewer may not read the connection
    "/sparkpoint/api/pipelines/sp_local/hidden",  # exists, the viewer may not read it
    "/sparkpoint/api/pipelines/sp_trap/trapped",  # exists, the viewer may not read it
    "/sparkpoint/api/pipelines/sp_local/a%20b",  # malformed
]


@pytest.mark.parametrize("api", [True, False], ids=["json", "html"])
def test_one_404_for_missing_and_forbidden_pipelines(ui_stack: Stack, api: bool) -> None:
    """Whether a connection or pipeline exists is not told to who may not read it: every
    such answer is the same status, body and headers (but the date)."""
    answers = []
    for path in NOT_FOUND:
        response = get(ui_stack, path if api else path.replace("/api/", "/"), "viewer")
        assert response.status_code == 404, (path, response.status_code, response.text[:300])
        headers = {k: v for k, v in response.headers.items() if k.lower() != "date"}
        answers.append((path, response.text, headers))
    for path, body, headers in answers[1:]:
        assert (body, headers) == answers[0][1:], f"{path} answers unlike {answers[0][0]}"
    assert "no_such_conn" not in answers[0][1] and "ui_totals" not in answers[0][1]


SECURITY_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


def assert_security_headers(response: httpx.Response) -> None:
    where = f"{response.request.url} ({response.status_code})"
    for name, value in SECURITY_HEADERS.items():
        assert value in response.headers.get(name, ""), f"{where}: {name}={response.headers.get(name)!r}"
    assert "frame-ancestors 'self'" in response.headers.get("content-security-policy", ""), where


def test_every_response_carries_the_security_headers(ui_stack: Stack) -> None:
    for user in ("admin", "viewer"):
        for path in [*ROUTES, *NOT_FOUND, "/sparkpoint/dags/secret_dag",
                     "/sparkpoint/api/pipelines/sp_trap/trapped", "/sparkpoint/no-such-route"]:
            assert_security_headers(get(ui_stack, path, user))
    for path in ROUTES:  # and without a user (401)
        response = get(ui_stack, path)
        assert response.status_code == 401, (path, response.status_code)
        assert_security_headers(response)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/sparkpoint/api/pipelines/sp_local/not_listed", 404),  # the connection does not serve it
        ("/sparkpoint/api/pipelines/sp_local/..%2F..%2Fetc", 404),
        ("/sparkpoint/api/pipelines/sp_local/a%20b", 404),
        ("/sparkpoint/api/pipelines/no_such_conn/ui_totals", 404),
        ("/sparkpoint/api/pipelines/spark_default/ui_totals", 404),
        ("/sparkpoint/api/pipelines/sp_local/ui_totals/../../../etc/passwd", 404),
    ],
)
def test_path_parameters_are_validated(ui_stack: Stack, path: str, status: int) -> None:
    response = get(ui_stack, path, "admin")
    assert response.status_code == status, response.text
    assert_no_secret(response)


def test_no_secret_in_any_response(ui_stack: Stack) -> None:
    for user in ("admin", "viewer"):
        for path in [*ROUTES, "/sparkpoint/api/pipelines/sp_s3/s3_job",
                     "/sparkpoint/pipelines/sp_local/hidden"]:
            response = get(ui_stack, path, user)
            assert response.status_code in (200, 404), (path, user, response.status_code)
            assert_no_secret(response)


def test_the_json_history_lists_exactly_what_the_cli_lists(ui_stack: Stack) -> None:
    api = get(ui_stack, "/sparkpoint/api/pipelines/sp_local/ui_totals", "viewer").json()
    cli = ui_stack.cli_json("list", "--dir", str(ui_stack.root), "--job", "ui_totals")
    assert api["checkpoints"] == cli["checkpoints"] and api["savepoints"] == cli["savepoints"]
    assert [c["id"] for c in api["checkpoints"]] == [4, 3, 2], "4 batches, numRetained=3"
    assert len(api["savepoints"]) == 1
    # Two runs: the second restored the first's latest checkpoint, and both recorded their config.
    gens = api["generations"]
    assert ([g["generation"] for g in gens] == [2, 1]
            and [g["outcome"] for g in gens] == ["finished", "finished"])
    assert gens[0]["origin"] == "chk-2" and gens[1]["origin"] == "empty state"
    assert api["counts"] == {"completed": 4, "failed": 0, "in_progress": 0, "restored": 1, "lifetime": True}
    assert api["config"]["checkpoint.numRetained"] == 3 and api["config"]["trigger"] == "availableNow"
    assert api["latest_restore"]["generation"] == 2 and api["dag_ids"] == []


def test_metrics_are_prometheus_text_with_flinks_names(ui_stack: Stack) -> None:
    response = get(ui_stack, "/sparkpoint/metrics", "admin")
    assert (response.status_code == 200
            and response.headers["content-type"].startswith("text/plain; version=0.0.4"))
    lines = response.text.splitlines()
    assert "# TYPE sparkpoint_numberOfCompletedCheckpoints counter" in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{conn_id="sp_local",job="ui_totals"} 4' in lines
    assert 'sparkpoint_numberOfRestoredCheckpoints{conn_id="sp_local",job="ui_totals"} 1' in lines
    assert 'sparkpoint_generation{conn_id="sp_s3",job="s3_job"} 1' in lines
    cli = ui_stack.cli_json("metrics", "--dir", str(ui_stack.root), "--job", "ui_totals")
    values = cli["jobs"][0]["metrics"]  # type: ignore[index]
    assert ('sparkpoint_lastCheckpointSize{conn_id="sp_local",job="ui_totals"} '
            f'{values["lastCheckpointSize"]}' in lines)


def test_a_pipeline_on_s3_is_served_with_the_connections_credentials(ui_stack: Stack) -> None:
    response = get(ui_stack, "/sparkpoint/api/pipelines/sp_s3/s3_job", "admin")
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["root"].startswith("s3://") and [c["id"] for c in doc["checkpoints"]] == [2, 1]
    assert doc["checkpoints"][0]["state_partitions"] == 1
    assert_no_secret(response)


def test_the_page_charts_the_trend_of_every_checkpoint_the_runs_completed(ui_stack: Stack,
                                                                          airflow_home: Path) -> None:
    """Two runs of two checkpoints each: four points per chart (retention kept three
    checkpoints; the trend keeps all four, across the restart), in the JSON as on the page,
    as inline SVG under the unchanged content security policy (no script, no style attribute).
    `airflow_home` first: importing the plugin imports Airflow in this process, which reads
    its settings once."""
    import re

    from airflow_sparkpoint.plugins.page import CONTENT_SECURITY_POLICY

    api = get(ui_stack, "/sparkpoint/api/pipelines/sp_local/ui_totals", "viewer").json()
    assert [p["id"] for p in api["trend"]] == [1, 2, 3, 4]
    assert [p["batch_id"] for p in api["trend"]] == [0, 1, 2, 3]
    response = get(ui_stack, "/sparkpoint/pipelines/sp_local/ui_totals", "viewer")
    html = response.text
    svgs = re.findall(r'<svg class="trend" id="trend-([a-z_]+)" data-points="(\d+)"', html)
    assert svgs == [("duration_ms", "4"), ("bytes_copied", "4"), ("bytes_total", "4")], svgs
    polylines = re.findall(r'<polyline class="line" points="([^"]*)"', html)
    assert [len(p.split()) for p in polylines] == [4, 4, 4]
    assert len(re.findall(r'<circle class="dot"', html)) == 12
    assert "<script" not in html and "style=" not in html
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_the_page_and_its_endpoint_show_the_pipelines_cutovers_to_who_may_read_it(ui_stack: Stack) -> None:
    """A zero-downtime cutover's state (here: planned, green's warm-up at batch 1, then
    called off) in the JSON history and as a table on the page, behind Airflow's
    authentication like every other part of the pipeline."""
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.cutover import CutoverPlan, CutoverProgress, CutoverStore
    from airflow_sparkpoint.storage import open_storage

    catalog = Catalog(open_storage(str(ui_stack.root)), "ui_totals")
    store = CutoverStore(catalog)
    cid = "1764370000000-0123abcd"
    store.plan(CutoverPlan(cid, "ui_totals", 2, catalog.checkpoint_uri(4), 3, "ui_totals-shadow",
                           str(ui_stack.root / "_cutover" / cid), created_at=1764370000.0))
    store.progress(CutoverProgress(cid, 1))
    path = "/sparkpoint/api/pipelines/sp_local/ui_totals"
    assert get(ui_stack, path).status_code in (401, 403)
    shown = get(ui_stack, path, "viewer").json()["cutovers"]
    assert [(c["id"], c["step"], c["green_replayed_batch"]) for c in shown] == [(cid, "planned", 1)], shown
    store.end(cid, "aborted", step="warmup", reason="called off by the ui test")
    shown = get(ui_stack, path, "viewer").json()["cutovers"]
    assert [(c["step"], c["reason"]) for c in shown] == [("aborted", "called off by the ui test")], shown
    html = get(ui_stack, "/sparkpoint/pipelines/sp_local/ui_totals", "viewer").text
    table = html[html.index('<table id="cutovers">'):]
    assert cid in table[:table.index("</table>")] and "aborted (called off)" in table
