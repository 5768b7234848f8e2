"""One scrubber for every response, error, event and command line (issue #46): what a
``sparkpoint`` connection holds never reaches someone who may not read it.

* ``user:password`` typed into the connection's ``storage_uri`` (not the host field) was
  shown to a DAG reader in the UI's 502: ``storage_uri`` counted as a plain field and the
  message quoted it without a scheme (``bucket 'KEY:PW@bucket' ...``), which the URL
  pattern needed;
* nested extra values were never scrubbed;
* credentials an ``aws`` connection yields (a role's session) were unknown to a hook made
  afresh to scrub an error (the UI's `redact`);
* the CLI's error line and the triggers' error events were not scrubbed at all.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

KEY_ID = f"AKIASCRUB{uuid.uuid4().hex[:11].upper()}"
PASSWORD = f"pw-{uuid.uuid4().hex}"
TOKEN = f"nested-token-{uuid.uuid4().hex}"
SESSION = f"session-{uuid.uuid4().hex}"
ROLE_SECRET = f"role-secret-{uuid.uuid4().hex}"


def assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets or (KEY_ID, PASSWORD, TOKEN, SESSION, ROLE_SECRET):
        assert secret not in text, f"{secret!r} shown in: {text}"


def connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.mark.airflow
def test_the_ui_502_never_shows_credentials_typed_into_the_storage_uri(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi import HTTPException

    from airflow_sparkpoint.plugins import app

    connection(monkeypatch, "sp_typed", conn_type="sparkpoint",
               extra={"storage_uri": f"s3://{KEY_ID}:{PASSWORD}@bucket/sp", "jobs": ["orders"]})
    monkeypatch.setattr(app, "can_read", lambda user, pipeline: True)  # the auth manager: not under test here
    with pytest.raises(HTTPException) as info:
        app._load(object(), "sp_typed", "orders")
    assert info.value.status_code == 502
    assert "sp_typed/orders" in str(info.value.detail)  # the store was read, and failed
    assert_clean(str(info.value.detail), KEY_ID, PASSWORD)


@pytest.mark.airflow
def test_nested_extra_values_and_bare_user_info_are_scrubbed(airflow_home: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    connection(monkeypatch, "sp_nested", conn_type="sparkpoint", host="/tmp/sp",
               extra={"client": {"auth": {"token": TOKEN}, "retries": [3, {"key": PASSWORD}]},
                      "jobs": ["orders"]})
    hook = SparkpointHook("sp_nested")
    message = (f"client config {{'auth': {{'token': '{TOKEN}'}}, 'key': '{PASSWORD}'}}; "
               f"bucket name '{KEY_ID}:{PASSWORD}@bucket' is invalid")
    scrubbed = hook.scrub(message)
    assert_clean(scrubbed, TOKEN, PASSWORD, KEY_ID)
    assert "bucket name 'bucket' is invalid" in scrubbed, scrubbed
    assert hook.scrub_value({"error": message, "n": [message]}) == {"error": scrubbed, "n": [scrubbed]}


@pytest.mark.airflow
def test_credentials_an_aws_connection_yields_are_scrubbed_by_any_hook(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from botocore.credentials import ReadOnlyCredentials

    from airflow_sparkpoint.hooks import SparkpointHook

    connection(monkeypatch, "aws_role", conn_type="aws",
               extra={"role_arn": "arn:aws:iam::123456789012:role/r"})
    connection(monkeypatch, "sp_role", conn_type="sparkpoint", host="s3://bucket/sp",
               extra={"aws_conn_id": "aws_role", "jobs": ["orders"]})
    # The role's session (STS cannot be reached here): what the Amazon provider would return.
    monkeypatch.setattr(AwsBaseHook, "get_credentials",
                        lambda self, region_name=None: ReadOnlyCredentials("ASIA" + KEY_ID[4:], ROLE_SECRET,
                                                                           SESSION))
    assert SparkpointHook("sp_role").storage_options["aws_session_token"] == SESSION  # the task's hook
    fresh = SparkpointHook("sp_role")  # the UI's redact() and any later scrub make their own
    assert_clean(fresh.scrub(f"S3 said: signature {ROLE_SECRET} / token {SESSION} rejected"), ROLE_SECRET,
                 SESSION)


def test_the_cli_error_line_never_shows_a_storage_uris_credentials(
    capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_sparkpoint.cli import main

    code = main(["list", "--dir", f"s3://{KEY_ID}:{PASSWORD}@bucket/sp", "--job", "orders"])
    _out, err = capsys.readouterr()
    assert code != 0 and "error" in err
    assert_clean(err, KEY_ID, PASSWORD)


@pytest.mark.airflow
def test_a_triggers_error_event_is_scrubbed(airflow_home: Path) -> None:
    from airflow_sparkpoint.triggers.checkpoint import _error

    event = _error(f"storage unreachable: http://{KEY_ID}:{PASSWORD}@proxy:3128 and "
                   f"{KEY_ID}:{PASSWORD}@bucket")
    assert_clean(event["message"], KEY_ID, PASSWORD)
    assert "proxy:3128" in event["message"]
