"""The plugin's routes on a real Airflow API server: authentication on every route, access
by the DAGs that use a pipeline (else by the connection), validated path parameters, no
secret in any response, the JSON equal to `sparkpoint list --json`, Prometheus metrics,
and a pipeline on S3."""

from __future__ import annotations

import httpx
import pytest

from tests.ui.conftest import SECRETS, Stack

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


def test_access_follows_the_dags_that_use_the_pipeline(ui_stack: Stack) -> None:
    # ui_totals: used by open_dag (readable by a viewer); hidden: used by secret_dag (denied
    # to non-admins); lonely: no DAG known, so access to the connection decides (op and up).
    assert get(ui_stack, "/sparkpoint/pipelines/sp_local/ui_totals", "viewer").status_code == 200
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/hidden", "viewer").status_code == 403
    assert get(ui_stack, "/sparkpoint/pipelines/sp_local/hidden", "op").status_code == 403
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/hidden", "admin").status_code == 200
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/lonely", "viewer").status_code == 403
    assert get(ui_stack, "/sparkpoint/api/pipelines/sp_local/lonely", "op").status_code == 200
    listed = {p["job"] for p in get(ui_stack, "/sparkpoint/api/pipelines", "viewer").json()["pipelines"]}
    assert listed == {"ui_totals"}  # s3_job has no known DAG and viewers cannot read connections
    every = {p["job"] for p in get(ui_stack, "/sparkpoint/api/pipelines", "admin").json()["pipelines"]}
    assert every == {"ui_totals", "lonely", "hidden", "s3_job"}
    metrics = get(ui_stack, "/sparkpoint/metrics", "viewer").text
    assert 'job="ui_totals"' in metrics and 'job="hidden"' not in metrics


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
        for path in [*ROUTES, "/sparkpoint/api/pipelines/sp_s3/s3_job", "/sparkpoint/pipelines/sp_local/hidden"]:
            response = get(ui_stack, path, user)
            assert response.status_code in (200, 403), (path, user, response.status_code)
            assert_no_secret(response)


def test_the_json_history_lists_exactly_what_the_cli_lists(ui_stack: Stack) -> None:
    api = get(ui_stack, "/sparkpoint/api/pipelines/sp_local/ui_totals", "viewer").json()
    cli = ui_stack.cli_json("list", "--dir", str(ui_stack.root), "--job", "ui_totals")
    assert api["checkpoints"] == cli["checkpoints"] and api["savepoints"] == cli["savepoints"]
    assert [c["id"] for c in api["checkpoints"]] == [4, 3, 2], "4 batches, numRetained=3"
    assert len(api["savepoints"]) == 1
    # Two runs: the second restored the first's latest checkpoint, and both recorded their config.
    gens = api["generations"]
    assert [g["generation"] for g in gens] == [2, 1] and [g["outcome"] for g in gens] == ["finished", "finished"]
    assert gens[0]["origin"] == "chk-2" and gens[1]["origin"] == "empty state"
    assert api["counts"] == {"completed": 4, "failed": 0, "in_progress": 0, "restored": 1, "lifetime": True}
    assert api["config"]["checkpoint.numRetained"] == 3 and api["config"]["trigger"] == "availableNow"
    assert api["latest_restore"]["generation"] == 2 and api["dag_ids"] == []


def test_metrics_are_prometheus_text_with_flinks_names(ui_stack: Stack) -> None:
    response = get(ui_stack, "/sparkpoint/metrics", "admin")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = response.text.splitlines()
    assert "# TYPE sparkpoint_numberOfCompletedCheckpoints counter" in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{conn_id="sp_local",job="ui_totals"} 4' in lines
    assert 'sparkpoint_numberOfRestoredCheckpoints{conn_id="sp_local",job="ui_totals"} 1' in lines
    assert 'sparkpoint_generation{conn_id="sp_s3",job="s3_job"} 1' in lines
    cli = ui_stack.cli_json("metrics", "--dir", str(ui_stack.root), "--job", "ui_totals")
    values = cli["jobs"][0]["metrics"]  # type: ignore[index]
    assert f'sparkpoint_lastCheckpointSize{{conn_id="sp_local",job="ui_totals"}} {values["lastCheckpointSize"]}' in lines


def test_a_pipeline_on_s3_is_served_with_the_connections_credentials(ui_stack: Stack) -> None:
    response = get(ui_stack, "/sparkpoint/api/pipelines/sp_s3/s3_job", "admin")
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["root"].startswith("s3://") and [c["id"] for c in doc["checkpoints"]] == [2, 1]
    assert doc["checkpoints"][0]["state_partitions"] == 1
    assert_no_secret(response)
