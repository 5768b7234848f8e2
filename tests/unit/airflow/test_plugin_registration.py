"""The UI plugin is registered by the provider and through the airflow.plugins entry point,
never twice; its app serves no unauthenticated docs route."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def test_the_provider_and_the_entry_point_name_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow import settings

    from airflow_sparkpoint import plugins
    from airflow_sparkpoint.get_provider_info import get_provider_info

    (declared,) = get_provider_info()["plugins"]
    module, name = declared["plugin-class"].rsplit(".", 1)
    plugin = getattr(import_module(module), name)
    assert plugin.name == declared["name"] == "sparkpoint"
    assert [a["url_prefix"] for a in plugin.fastapi_apps] == ["/sparkpoint"]
    assert {v["destination"] for v in plugin.external_views} == {"nav", "dag"}
    assert any(e.value == "airflow_sparkpoint.plugins:entry_point_plugin"
               for e in entry_points(group="airflow.plugins"))

    monkeypatch.setattr(plugins, "_handed_out", False)
    monkeypatch.setattr(settings, "LAZY_LOAD_PROVIDERS", False)
    assert plugins.entry_point_plugin is None  # Airflow loads provider plugins itself
    monkeypatch.setattr(settings, "LAZY_LOAD_PROVIDERS", True)
    assert plugins.entry_point_plugin is plugins.SparkpointPlugin
    assert plugins.entry_point_plugin is None  # a second distribution of the same package
    app = plugin.fastapi_apps[0]["app"]
    paths = {getattr(route, "path", "") for route in app.routes}
    assert not paths & {"/docs", "/redoc", "/openapi.json"}
    assert {"/pipelines", "/pipelines/{conn_id}/{job}", "/metrics"} <= paths
