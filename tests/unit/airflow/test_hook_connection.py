"""The ``sparkpoint`` connection (issue #19): its own form fields, and S3 credentials from
an ``aws_conn_id`` through the Amazon provider's AwsBaseHook (installed here), from
boto3's default chain when there is none, and a clear error when the provider is missing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from tests.support.records import transaction_record

pytestmark = pytest.mark.airflow

SECRET = "s3cr3t-from-aws-conn"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_form_fields_are_read_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    conn(monkeypatch, "sp_form", conn_type="sparkpoint", host="s3://bucket/sp", login="AKIAFORM",
         password="pw",
         extra={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                "jobs": "orders, sessions ,", "pyspark_python": "/opt/py/bin/python"})
    hook = SparkpointHook("sp_form")
    assert hook.storage_uri == "s3://bucket/sp"
    assert hook.storage_options == {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                                    "aws_access_key_id": "AKIAFORM", "aws_secret_access_key": "pw"}
    assert hook.jobs == ["orders", "sessions"] and hook.pyspark_python == "/opt/py/bin/python"
    # Forms of older Airflow releases stored the fields prefixed.
    conn(monkeypatch, "sp_prefixed", conn_type="sparkpoint", host="/data/sp",
         extra={"extra__sparkpoint__region_name": "us-west-2", "extra__sparkpoint__jobs": "a"})
    old = SparkpointHook("sp_prefixed")
    assert old.storage_options == {"region_name": "us-west-2"} and old.jobs == ["a"]


def test_aws_conn_id_credentials_come_through_aws_base_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    from airflow_sparkpoint.hooks import SparkpointHook

    conn(monkeypatch, "aws_sp", conn_type="aws", login="AKIAFROMAWS", password=SECRET,
         extra={"aws_session_token": "tok-123", "region_name": "ap-south-1",
                "endpoint_url": "http://127.0.0.1:9001"})
    conn(monkeypatch, "sp_aws", conn_type="sparkpoint", host="s3://bucket/sp",
         extra={"aws_conn_id": "aws_sp"})
    calls: list[str] = []
    original = AwsBaseHook.get_credentials

    def spy(self: Any, region_name: str | None = None) -> Any:
        calls.append(self.aws_conn_id)
        return original(self, region_name)

    monkeypatch.setattr(AwsBaseHook, "get_credentials", spy)
    options = SparkpointHook("sp_aws").storage_options
    assert calls == ["aws_sp"], "the credentials must come from AwsBaseHook"
    assert options == {"aws_access_key_id": "AKIAFROMAWS", "aws_secret_access_key": SECRET,
                       "aws_session_token": "tok-123", "endpoint_url": "http://127.0.0.1:9001",
                       "region_name": "ap-south-1"}

    async def resolve() -> dict[str, Any]:  # the triggerer's way: async connection API
        hook = SparkpointHook("sp_aws")
        await hook.aresolve()
        return hook.storage_options

    assert asyncio.run(resolve()) == options and calls == ["aws_sp", "aws_sp"]


def test_without_credentials_boto3s_default_chain_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    conn(monkeypatch, "sp_chain", conn_type="sparkpoint", host="s3://bucket/sp",
         extra={"region_name": "us-east-1"})
    assert SparkpointHook("sp_chain").storage_options == {"region_name": "us-east-1"}


def test_aws_conn_id_without_the_amazon_provider_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    conn(monkeypatch, "aws_missing", conn_type="aws", login="AKIA", password=SECRET)
    conn(monkeypatch, "sp_missing", conn_type="sparkpoint", host="s3://bucket/sp",
         extra={"aws_conn_id": "aws_missing"})
    with pytest.raises(ConfigError, match=r"aws_conn_id='aws_missing' needs the Amazon provider .* "
                                          r"pip install 'airflow-sparkpoint\[amazon\]'") as info:
        _ = SparkpointHook("sp_missing").storage_options
    assert SECRET not in str(info.value)


def test_form_widgets_for_airflow_before_3_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow < 3.2 builds the form from the hook with wtforms and Flask-AppBuilder
    widgets; neither is installed with Airflow 3.3, so they are stand-ins here (an edge
    that cannot run in this environment)."""
    from airflow_sparkpoint.get_provider_info import CONN_FIELDS
    from airflow_sparkpoint.hooks import SparkpointHook

    class StringField:
        def __init__(self, label: str, **kwargs: Any) -> None:
            self.label, self.kwargs = label, kwargs

    stubs = {
        "wtforms": types.SimpleNamespace(StringField=StringField),
        "wtforms.validators": types.SimpleNamespace(Optional=lambda: "optional"),
        "flask_babel": types.SimpleNamespace(lazy_gettext=lambda text: text),
        "flask_appbuilder.fieldwidgets": types.SimpleNamespace(BS3TextFieldWidget=lambda: "text-widget"),
    }
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    widgets = SparkpointHook.get_connection_form_widgets()
    assert list(widgets) == list(CONN_FIELDS)
    assert widgets["endpoint_url"].label == "S3 endpoint URL"
    assert widgets["aws_conn_id"].kwargs["widget"] == "text-widget"


def test_the_commit_step_uses_the_sink_the_connection_declares_unless_the_operator_declares_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_sparkpoint.checkpoints import Catalog, layout
    from airflow_sparkpoint.exceptions import SinkError
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointCommitOperator
    from airflow_sparkpoint.sinks.directory import DirectorySink
    from airflow_sparkpoint.storage import open_storage
    from tests.support.records import checkpoint_at

    JOB = "orders"
    root = str(tmp_path / "sp")
    declared = {"kind": "directory", "uri": str(tmp_path / "out"), "format": "json"}
    conn(monkeypatch, "sp_declared", conn_type="sparkpoint", host=root,
         extra={"jobs": {JOB: {"dags": ["etl_orders"], "sink": declared}, "payments": {"dags": ["etl_pay"]}}})
    catalog = Catalog(open_storage(root), JOB)
    checkpoint_at(catalog, 3)
    other = DirectorySink(str(tmp_path / "elsewhere"), "json")
    record = transaction_record(other, 1, 1, {"staging": f"_staging/{layout.txn_id(JOB, 1, 1)}", "files": []},
                                job=JOB)
    catalog.put_transaction(record)

    commit = SparkpointCommitOperator(task_id="commit", job_name=JOB, sparkpoint_conn_id="sp_declared")
    with pytest.raises(SinkError, match="does not match the declared sink directory:"):
        commit.execute({})  # type: ignore[arg-type]
    assert [r.txn_id for r in catalog.transactions()] == [record.txn_id], "the refused record was settled"
    # the operator's own sink wins over the connection's
    own = SparkpointCommitOperator(task_id="own", job_name=JOB, sparkpoint_conn_id="sp_declared", sink=other)
    assert own.execute({}) == {"committed": [], "already": [], "aborted": [record.txn_id],  # type: ignore[arg-type]
                               "pending": []}

    hook = SparkpointHook("sp_declared")
    assert hook.jobs == [JOB, "payments"]
    sink = hook.declared_sink(JOB)
    assert sink is not None and sink.sink_id == DirectorySink(declared["uri"], "json").sink_id
    assert hook.declared_sink("payments") is None and hook.declared_sink("unlisted") is None
    assert SparkpointHook(None, storage_uri=root).declared_sink(JOB) is None


def test_a_malformed_connection_declared_sink_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointCommitOperator

    conn(monkeypatch, "sp_bad_sink", conn_type="sparkpoint", host=str(tmp_path / "sp"),
         extra={"jobs": {"orders": {"sink": {"uri": "/data/out"}}}})
    with pytest.raises(ConfigError, match=r"sp_bad_sink.*orders.*is not a sink"):
        SparkpointHook("sp_bad_sink").declared_sink("orders")
    commit = SparkpointCommitOperator(task_id="commit", job_name="orders", sparkpoint_conn_id="sp_bad_sink")
    with pytest.raises(ConfigError, match="is not a sink"):  # never falls back to the records' own sinks
        commit.execute({})  # type: ignore[arg-type]
