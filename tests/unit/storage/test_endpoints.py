"""The storage options of an S3 endpoint and region are built in one place
(`storage.endpoints.s3_options`): the CLI, the runtime's configuration and the hook
all hand `open_storage` and the sinks the same options for the same settings."""

from __future__ import annotations

import argparse

import pytest

from airflow_sparkpoint.cli.options import storage_options as _storage_options
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.storage.endpoints import s3_options


@pytest.mark.parametrize(("endpoint", "region", "expected"), [
    (None, None, {}),
    ("", "  ", {}),
    ("http://127.0.0.1:9000", None, {"endpoint_url": "http://127.0.0.1:9000"}),
    (None, "eu-west-1", {"region_name": "eu-west-1"}),
    (" http://minio:9000 ", " eu-west-1", {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}),
])
def test_the_cli_and_the_runtime_build_the_same_storage_options(
        endpoint: str | None, region: str | None, expected: dict[str, str]) -> None:
    assert s3_options(endpoint, region) == expected
    assert _storage_options(argparse.Namespace(s3_endpoint=endpoint, s3_region=region)) == expected
    conf = {"spark.sparkpoint.dir": "s3://bucket/sp", "spark.sparkpoint.job": "orders",
            "spark.sparkpoint.workDir": "/tmp/sp-live"}
    if endpoint is not None:
        conf["spark.sparkpoint.s3.endpoint"] = endpoint
    if region is not None:
        conf["spark.sparkpoint.s3.region"] = region
    assert SparkpointConfig.from_conf(conf).storage_options == expected
