"""`spark.sparkpoint.*` validation: bad values fail before anything is written, naming
the key, the value and what is allowed."""

from __future__ import annotations

import re

import pytest

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.config import KEYS, PREFIX, SparkpointConfig, parse_duration, parse_trigger

BASE = {f"{PREFIX}dir": "/tmp/sp", f"{PREFIX}job": "orders"}


def conf(**extra: str) -> dict[str, str]:
    return {**BASE, **{PREFIX + k.replace("__", "."): v for k, v in extra.items()}}


def test_defaults_match_the_design():
    cfg = SparkpointConfig.from_conf(BASE)
    assert cfg.restore == "latest"
    assert cfg.trigger.kind == "availableNow"
    assert cfg.checkpoint_interval_s == 0
    assert cfg.num_retained == 3
    assert cfg.checkpoint_timeout_s == 600
    assert cfg.tolerable_failures == 0
    assert cfg.commit_mode == "checkpoint"
    assert cfg.poll_interval_s == 2
    assert cfg.state_store == "rocksdb"
    assert cfg.storage_options == {}
    assert cfg.driver_staging_max_bytes == 32 * 1024 * 1024
    assert cfg.final_snapshot_timeout_s is None  # Spark's maintenance interval + 30 s
    assert cfg.final_snapshot_min_replay == 16 * 1024 * 1024


def test_every_documented_key_is_accepted():
    values = {
        "workDir": "/tmp/live", "restore": "none", "restore.force": "true",
        "restore.allowForeignJob": "false",
        "restore.sinkAhead": "rewind", "trigger": "processingTime:10s", "checkpoint.interval": "30s",
        "checkpoint.numRetained": "5", "checkpoint.timeout": "1min", "checkpoint.tolerableFailures": "2",
        "checkpoint.finalSnapshot.timeout": "45s", "checkpoint.finalSnapshot.minReplay": "1m",
        "commit.mode": "external", "control.pollInterval": "500ms", "stateStore": "hdfs",
        "s3.endpoint": "http://127.0.0.1:9000", "s3.region": "eu-west-1", "delta.driverStagingMaxBytes": "4m",
        "restore.statePartitions": "8", "test.pauseAt": "stage:2", "test.pauseDir": "/tmp/pauses",
        "takeover": "true",
        "codeVersion": "v2", "shadow.mode": "compare", "shadow.dir": "/tmp/scratch",
        "shadow.job": "orders-green",
        "shadow.from": "/tmp/sp/orders/chk-7", "shadow.workDir": "/tmp/scratch-live",
        "shadow.untilBatch": "12", "shadow.pollInterval": "250ms",
        "cutover": "1764370000000-0123abcd",
    }
    assert set(values) | {"dir", "job"} == set(KEYS)
    cfg = SparkpointConfig.from_conf({**BASE, **{PREFIX + k: v for k, v in values.items()}})
    assert cfg.trigger.interval_s == 10
    assert cfg.checkpoint_interval_s == 30
    assert cfg.poll_interval_s == 0.5
    assert cfg.storage_options == {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}
    assert cfg.driver_staging_max_bytes == 4 * 1024 * 1024
    assert cfg.restore_state_partitions == 8
    assert (cfg.final_snapshot_timeout_s, cfg.final_snapshot_min_replay) == (45, 1024 * 1024)
    assert (cfg.test_pause_at, cfg.test_pause_dir) == ("stage:2", "/tmp/pauses")
    assert cfg.code_version == "v2"
    assert cfg.shadow is not None
    assert (cfg.shadow.mode, cfg.shadow.dir, cfg.shadow.job, cfg.shadow.source, cfg.shadow.work_dir,
            cfg.shadow.until_batch, cfg.shadow.poll_interval_s) == (
        "compare", "/tmp/scratch", "orders-green", "/tmp/sp/orders/chk-7", "/tmp/scratch-live", 12, 0.25)
    assert cfg.cutover == "1764370000000-0123abcd"


def test_a_malformed_cutover_id_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"cutover='c1' is invalid; expected a cutover id"):
        SparkpointConfig.from_conf({**BASE, PREFIX + "cutover": "c1"})


@pytest.mark.parametrize("value", ["0", "-2", "four", "2.5"])
def test_state_partitions_must_be_a_positive_integer(value):
    with pytest.raises(ConfigError,
                       match=rf"spark\.sparkpoint\.restore\.statePartitions='{re.escape(value)}'"):
        SparkpointConfig.from_conf(conf(restore__statePartitions=value))


def test_a_pause_point_needs_a_directory():
    with pytest.raises(ConfigError, match=r"test\.pauseAt='stage:1' needs spark\.sparkpoint\.test\.pauseDir"):
        SparkpointConfig.from_conf(conf(test__pauseAt="stage:1"))


@pytest.mark.parametrize(("value", "expected"), [
    ("0", 0), ("1048576", 1048576), ("512k", 512 * 1024), ("32m", 32 * 1024**2), ("1g", 1024**3),
    ("2 GiB", 2 * 1024**3), ("64MB", 64 * 1024**2), ("100b", 100),
])
def test_driver_staging_sizes(value, expected):
    assert (SparkpointConfig.from_conf(conf(delta__driverStagingMaxBytes=value))
            .driver_staging_max_bytes == expected)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({f"{PREFIX}job": "x"}, "spark.sparkpoint.dir is required"),
        ({f"{PREFIX}dir": "/x"}, "spark.sparkpoint.job is required"),
        (conf(job="../etc"), "'../etc'"),
        (conf(job="has space"), "'has space'"),
        (conf(dir="ftp://host/x"), "'ftp://host/x'"),
        (conf(dir="s3://"), "'s3://'"),
        (conf(restore=""), "restore=''"),
        (conf(restore="gopher://x"), "'gopher://x'"),
        (conf(trigger="continuous"), "trigger='continuous'"),
        (conf(trigger="processingTime:0s"), "positive interval"),
        (conf(checkpoint__interval="soon"), "checkpoint.interval='soon'"),
        (conf(checkpoint__numRetained="0"), "checkpoint.numRetained='0'"),
        (conf(checkpoint__numRetained="three"), "checkpoint.numRetained='three'"),
        (conf(checkpoint__timeout="0"), "checkpoint.timeout"),
        (conf(checkpoint__tolerableFailures="-1"), "checkpoint.tolerableFailures='-1'"),
        (conf(commit__mode="eventually"), "commit.mode='eventually'"),
        (conf(control__pollInterval="0s"), "control.pollInterval"),
        (conf(stateStore="memory"), "stateStore='memory'"),
        (conf(s3__endpoint="minio:9000"), "s3.endpoint='minio:9000'"),
        (conf(restore__force="maybe"), "restore.force='maybe'"),
        (conf(restore__sinkAhead="ignore"), "restore.sinkAhead='ignore'"),
        (conf(workDir="ftp://x/live"), "workDir='ftp://x/live'"),
        (conf(delta__driverStagingMaxBytes="-1"), "delta.driverStagingMaxBytes='-1' is not a size"),
        (conf(delta__driverStagingMaxBytes="lots"), "delta.driverStagingMaxBytes='lots' is not a size"),
        (conf(delta__driverStagingMaxBytes="1.5g"), "delta.driverStagingMaxBytes='1.5g'"),
        ({**BASE, f"{PREFIX}checkpoint.numRetain": "3"},
         "spark.sparkpoint.checkpoint.numRetain is not a known"),
    ],
)
def test_bad_values_name_the_key_and_value(settings, named):
    with pytest.raises(ConfigError) as info:
        SparkpointConfig.from_conf(settings)
    assert named in str(info.value)


@pytest.mark.parametrize(("text", "seconds"),
                         [("0", 0), ("500ms", 0.5), ("2s", 2), ("10min", 600), ("1h", 3600),
                           ("1.5", 1.5)])
def test_durations(text, seconds):
    assert parse_duration("x", text) == seconds


def test_trigger_spark_arguments():
    assert parse_trigger("availableNow").spark_kwargs() == {"availableNow": True}
    assert parse_trigger("processingTime:2s").spark_kwargs() == {"processingTime": "2000 milliseconds"}
    assert str(parse_trigger("processingTime:2s")) == "processingTime:2s"


# Spark's own interval syntax (what users write in trigger(processingTime=...)), issue #19.
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500 milliseconds", 0.5), ("5 seconds", 5), ("1 minute", 60), ("2 hours", 7200), ("1 day", 86400),
        ("1 second", 1), ("10 millisecond", 0.01), ("250 microseconds", 0.00025), ("interval 10 seconds", 10),
        ("INTERVAL 1 MINUTE", 60), ("1 minute 30 seconds", 90), ("1 hour 2 minutes 3 seconds", 3723),
        ("2 weeks", 14 * 86400), ("5s", 5), ("100ms", 0.1), ("3m", 180), ("2d", 172800), ("1.5 minutes", 90),
        ("250us", 0.00025), ("5 sec", 5), ("2 mins", 120), ("4 hrs", 14400), ("1min", 60),
    ],
)
def test_durations_accept_sparks_interval_syntax(text, seconds):
    assert parse_duration("x", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5 seconds", "500 milliseconds", "1 minute", "interval 2 seconds"])
def test_processing_time_trigger_accepts_sparks_interval_syntax(text):
    trigger = parse_trigger(f"processingTime:{text}")
    assert trigger.kind == "processingTime" and trigger.interval_s == pytest.approx(parse_duration("x", text))
    settings = SparkpointConfig.from_conf({**BASE, f"{PREFIX}trigger": f"processingTime:{text}",
                                           f"{PREFIX}control.pollInterval": text,
                                           f"{PREFIX}checkpoint.interval": text,
                                           f"{PREFIX}checkpoint.timeout": text})
    assert settings.poll_interval_s == settings.checkpoint_interval_s == settings.checkpoint_timeout_s > 0


@pytest.mark.parametrize("text",
                         ["1 month", "2 years", "5 fortnights", "seconds", "5 seconds ago", "-5 seconds",
                          "1 minute minute", "interval", "5 s s", ""])
def test_bad_durations_name_the_value_and_the_forms(text):
    with pytest.raises(ConfigError) as info:
        parse_duration("trigger", text)
    message = str(info.value)
    assert f"spark.sparkpoint.trigger={text!r}" in message and "'5 seconds'" in message


def test_cli_and_operator_durations_read_sparks_syntax_too():
    import argparse

    from airflow_sparkpoint.cli.options import positive_seconds as _positive_seconds
    from airflow_sparkpoint.runtime.config import duration_value

    assert _positive_seconds("5 minutes") == 300 and _positive_seconds("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match="'soon' is not a number of seconds"):
        _positive_seconds("soon")
    with pytest.raises(argparse.ArgumentTypeError):
        _positive_seconds("0")
    assert duration_value("timeout", "1 minute 30 seconds") == 90 and duration_value("timeout", 7) == 7
    with pytest.raises(ConfigError, match="timeout='later' is not a duration"):
        duration_value("timeout", "later")


@pytest.mark.parametrize("work_dir",
                         ["hdfs://nn:8020/live", "s3a://bucket/live", "abfs://c@a.dfs.core.windows.net/l",
                          "gs://bucket/live", "viewfs://cluster/live"])
def test_a_work_dir_the_runtime_cannot_capture_is_refused_naming_it_and_what_works(work_dir):
    with pytest.raises(ConfigError) as info:
        SparkpointConfig.from_conf(conf(workDir=work_dir))
    message = str(info.value)
    assert f"workDir={work_dir!r}" in message and "shared mount" in message and "file://" in message


@pytest.mark.parametrize("work_dir",
                         ["/mnt/shared/live", "file:///mnt/shared/live", "file:/mnt/shared/live", "live"])
def test_a_filesystem_work_dir_is_accepted(work_dir):
    assert SparkpointConfig.from_conf(conf(workDir=work_dir)).work_dir == work_dir


def test_an_s3_dir_without_a_work_dir_is_refused_by_the_configuration_itself():
    with pytest.raises(ConfigError,
                       match=r"workDir is required when spark.sparkpoint.dir='s3://b/p' is on S3"):
        SparkpointConfig.from_conf({**BASE, f"{PREFIX}dir": "s3://b/p"})


@pytest.mark.parametrize(("key", "suggestion"), [
    ("checkpoint.numRetain", "checkpoint.numRetained"),
    ("checkpoint.intervall", "checkpoint.interval"),
    ("restore.sinkahead", "restore.sinkAhead"),
    ("workdir", "workDir"),
])
def test_an_unknown_key_suggests_the_closest_known_one(key, suggestion):
    with pytest.raises(ConfigError) as info:
        SparkpointConfig.from_conf({**BASE, PREFIX + key: "3"})
    message = str(info.value)
    assert f"did you mean {PREFIX}{suggestion}?" in message, message
    assert "reference/config.md" in message, message


def test_an_unknown_key_like_no_other_lists_what_is_known():
    with pytest.raises(ConfigError) as info:
        SparkpointConfig.from_conf({**BASE, f"{PREFIX}zzzzzz": "1"})
    message = str(info.value)
    assert "did you mean" not in message and f"{PREFIX}checkpoint.numRetained" in message, message
