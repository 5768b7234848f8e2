"""Provider metadata for Airflow's ProvidersManager (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint import __version__

__all__ = ["CONN_FIELDS", "UI_FIELD_BEHAVIOUR", "get_provider_info"]

# The connection form, declared: Airflow >= 3.2 reads it without importing the hook (and
# without the deprecation warnings of the hook's form methods, which build the same form
# from these two dicts for older Airflow 3 releases).
CONN_FIELDS: dict[str, Any] = {
    "endpoint_url": {
        "label": "S3 endpoint URL",
        "description": "S3-compatible endpoint (MinIO, SeaweedFS, ...), e.g. "
                       "http://minio:9000; empty for AWS S3.",
        "schema": {"type": ["string", "null"]},
    },
    "region_name": {
        "label": "S3 region",
        "description": "e.g. us-east-1; empty: the AWS default chain (or the AWS connection's region).",
        "schema": {"type": ["string", "null"]},
    },
    "aws_conn_id": {
        "label": "AWS connection",
        "description": "An Airflow 'aws' connection for the S3 credentials (needs the Amazon provider); "
        "used when no access key is given above. Empty: boto3's default credential chain.",
        "schema": {"type": ["string", "null"]},
    },
    "jobs": {
        "label": "Jobs",
        "description": "Optional: pipelines (spark.sparkpoint.job names) stored under "
                       "this root, comma-separated. "
        "The UI lists every job under the root to who may read this connection.",
        "schema": {"type": ["string", "null"]},
    },
    "pyspark_python": {
        "label": "Python on the Spark cluster",
        "description": "The interpreter Spark's Python workers run (spark.pyspark.python), e.g. "
        "/opt/conda/bin/python. Empty: this worker's interpreter for local[...] masters, python3 otherwise.",
        "schema": {"type": ["string", "null"]},
    },
}

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema", "port"],
    "relabeling": {
        "host": "Storage URI",
        "login": "S3 access key id",
        "password": "S3 secret access key",
    },
    "placeholders": {
        "host": "s3://bucket/sparkpoint  or  file:///data/sparkpoint",
        "endpoint_url": "http://minio:9000",
        "region_name": "us-east-1",
        "aws_conn_id": "aws_default",
        "jobs": "orders, sessions",
    },
}


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
        "extra-links": [
            "airflow_sparkpoint.operators.links.SparkpointSparkUILink",
            "airflow_sparkpoint.operators.links.SparkpointCheckpointHistoryLink",
        ],
        "connection-types": [
            {
                "connection-type": "sparkpoint",
                "hook-class-name": "airflow_sparkpoint.hooks.SparkpointHook",
                "hook-name": "Sparkpoint",
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
                "conn-fields": CONN_FIELDS,
            }
        ],
    }
