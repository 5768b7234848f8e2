"""The Airflow UI plugin: a checkpoints page per Sparkpoint pipeline (Flink's checkpoints
tab), its JSON and Prometheus metrics, served by a FastAPI app under ``/sparkpoint``.

Registered by the provider (``plugins`` in `get_provider_info`) and, because Airflow loads
provider plugins only with ``[core] lazy_discover_providers = False``, also through the
``airflow.plugins`` entry point, which resolves to the plugin only in that default
(lazy) case so it is never registered twice. UI entries: *Browse → Sparkpoint
checkpoints* (the pipeline list) and a *Checkpoints* tab on every DAG (the pipelines that
DAG uses). See `airflow_sparkpoint.plugins.app` for the routes and their protection.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_sparkpoint.plugins.app import create_app

URL_PREFIX = "/sparkpoint"


class SparkpointPlugin(AirflowPlugin):
    name = "sparkpoint"
    # AirflowPlugin's own (mutable) class attributes
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Sparkpoint checkpoints"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {"name": "Sparkpoint checkpoints", "href": f"{URL_PREFIX}/pipelines", "destination": "nav",
         "category": "browse", "url_route": "sparkpoint"},
        {"name": "Checkpoints", "href": f"{URL_PREFIX}/dags/{{DAG_ID}}", "destination": "dag",
         "url_route": "sparkpoint_dag"},
    ]


_handed_out = False


def __getattr__(name: str) -> Any:
    """``entry_point_plugin``: the plugin for the ``airflow.plugins`` entry point, or None
    when Airflow loads provider plugins itself, and None after the first time in this
    process (a source checkout may expose the distribution twice, from an ``.egg-info``
    too): never registered twice, which Airflow would list as a plugin import error."""
    global _handed_out
    if name == "entry_point_plugin":
        from airflow import settings

        if _handed_out or not settings.LAZY_LOAD_PROVIDERS:
            return None
        _handed_out = True
        return SparkpointPlugin
    raise AttributeError(name)
