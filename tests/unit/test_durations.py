"""`airflow_sparkpoint.durations`: the one duration parser (timedelta, seconds, Spark's
duration strings), and that the conf parser and the CLI use it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_sparkpoint import durations
from airflow_sparkpoint.exceptions import ConfigError


@pytest.mark.parametrize("value", [30, 30.0, timedelta(seconds=30), "30", "30s", "30 seconds", "0.5 minutes",
                                   "interval 30 seconds", "30000ms"])
def test_every_form_reads_as_seconds(value: object) -> None:
    assert durations.seconds("x", value) == 30.0


@pytest.mark.parametrize("value", ["soon", "3 months", "-1", "1s 1s", True, float("nan"), [1], timedelta(0)])
def test_bad_values_name_the_parameter_and_the_value(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        durations.seconds("poll_interval", value)
    assert f"poll_interval={value!r}" in str(info.value)


def test_zero_and_none() -> None:
    assert durations.seconds("x", 0, allow_zero=True) == 0.0
    assert durations.optional_seconds("x", None) is None
    with pytest.raises(ConfigError, match="x=None"):
        durations.seconds("x", None)


@pytest.mark.parametrize("value", [0.0, 0.5, 30.0, 90.25, 86400.0, 1e6])
def test_conf_text_round_trips(value: float) -> None:
    assert durations.parse_text(durations.conf_text(value)) == value


def test_conf_parser_and_cli_use_the_same_parser() -> None:
    from airflow_sparkpoint.cli.options import positive_seconds as _positive_seconds
    from airflow_sparkpoint.runtime.config import parse_duration

    assert parse_duration("checkpoint.interval", "1 minute 30 seconds") == 90.0 == _positive_seconds("90s")
    with pytest.raises(ConfigError, match=r"spark\.sparkpoint\.checkpoint\.interval='0:00:30'"):
        parse_duration("checkpoint.interval", "0:00:30")
