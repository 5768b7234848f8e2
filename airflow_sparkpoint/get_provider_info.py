"""Provider metadata for Airflow's ProvidersManager (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint import __version__


def get_provider_info() -> dict[str, Any]:
    """Return the provider description; a plain dict so Airflow can read it without imports."""
    return {
        "package-name": "airflow-sparkpoint",
        "name": "Sparkpoint",
        "description": "Flink-grade checkpoints, savepoints and exactly-once output for PySpark pipelines.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Sparkpoint",
                "external-doc-url": "https://github.com/airflow-sparkpoint/airflow-sparkpoint",
                "tags": ["apache", "spark"],
            }
        ],
        "operators": [
            {"integration-name": "Sparkpoint", "python-modules": ["airflow_sparkpoint.operators"]},
        ],
        "sensors": [
            {"integration-name": "Sparkpoint", "python-modules": ["airflow_sparkpoint.sensors"]},
        ],
        "hooks": [
            {"integration-name": "Sparkpoint", "python-modules": ["airflow_sparkpoint.hooks"]},
        ],
        "triggers": [
            {"integration-name": "Sparkpoint", "python-modules": ["airflow_sparkpoint.triggers"]},
        ],
        "plugins": [
            {"name": "sparkpoint", "plugin-class": "airflow_sparkpoint.plugins.SparkpointPlugin"},
        ],
        "connection-types": [
            {
                "connection-type": "sparkpoint",
                "hook-class-name": "airflow_sparkpoint.hooks.SparkpointHook",
                "hook-name": "Sparkpoint",
                # Declarative form (Airflow >= 3.2 reads it without importing the hook and
                # without the deprecation warning of SparkpointHook.get_ui_field_behaviour,
                # which stays for older Airflow 3 releases); keep the two in sync.
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port"],
                    "relabeling": {
                        "host": "Storage URI",
                        "login": "S3 access key id",
                        "password": "S3 secret access key",
                    },
                    "placeholders": {
                        "host": "s3://bucket/sparkpoint  or  file:///data/sparkpoint",
                        "extra": '{"endpoint_url": "http://minio:9000", "region_name": "us-east-1", '
                        '"aws_conn_id": null}',
                    },
                },
            }
        ],
    }
