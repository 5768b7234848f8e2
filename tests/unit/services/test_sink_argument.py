"""`sparkpoint commit --sink KIND:URI --sink-option KEY=VALUE` as a sink declaration:
parsed by the services (`services.sinks.parse_sink_arg`), never by the sinks package."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.sinks import parse_sink_arg
from airflow_sparkpoint.sinks import resolve


def test_a_sink_argument_and_its_options_become_a_declaration() -> None:
    assert parse_sink_arg("delta:s3://b/t", ["mode=merge", "keys=id,day", "partition_by="]) == {
        "kind": "delta", "uri": "s3://b/t", "mode": "merge", "keys": ["id", "day"], "partition_by": []}


@pytest.mark.parametrize(("text", "options", "message"), [
    ("delta", [], "--sink 'delta' is invalid; expected KIND:URI"),
    (":s3://b/t", [], "expected KIND:URI"),
    ("delta:s3://b/t", ["mode"], "--sink-option 'mode' is invalid; expected KEY=VALUE"),
])
def test_a_malformed_sink_argument_is_a_config_error(text: str, options: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sink_arg(text, options)


def test_the_sinks_package_parses_no_command_line() -> None:
    assert not hasattr(resolve, "parse_sink_arg")
