"""`runtime.spark_support`: the supported Spark range, the runtime's libraries checked at
startup, the feature table and the rule for restoring across Spark lines (issue #29)."""

from __future__ import annotations

import sys

import pytest
from packaging.requirements import Requirement

from airflow_sparkpoint.exceptions import ConfigError, RestoreError
from airflow_sparkpoint.runtime import SparkpointJob, spark_support
from tests.support.paths import REPO


def extras() -> dict[str, list[str]]:
    import tomllib  # Python >= 3.11, as the development environment

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["project"]["optional-dependencies"]


def test_the_runtime_extra_is_the_list_the_driver_checks() -> None:
    assert sorted(extras()["runtime"]) == sorted(spark_support.RUNTIME_REQUIREMENTS.values())


def test_the_spark_extra_states_the_supported_range() -> None:
    (req,) = [Requirement(text) for text in extras()["spark"]]
    (low, high) = spark_support.SPARK_RANGE
    assert req.name == "pyspark"
    assert (req.specifier.contains(f"{low[0]}.{low[1]}.0")
            and not req.specifier.contains(f"{low[0]}.{low[1] - 1}.9"))
    assert (req.specifier.contains(f"{high[0]}.{high[1] - 1}.9")
            and not req.specifier.contains(f"{high[0]}.{high[1]}.0"))


def test_every_matrix_line_is_in_the_supported_range() -> None:
    rows = [line.split() for line in (REPO / "scripts/spark-lines.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert rows
    for line, version, *_ in rows:
        assert version.startswith(line + "."), (line, version)
        spark_support.check_spark_version(version)


def test_a_missing_library_fails_the_driver_before_spark_starts_naming_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "deltalake", None)
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ConfigError) as err:
        SparkpointJob.get_or_create(conf={"spark.sparkpoint.dir": "/nowhere", "spark.sparkpoint.job": "j"})
    message = str(err.value)
    assert "deltalake>=1.2,<2" in message and "boto3>=1.34" in message and "pyarrow" not in message
    assert sys.executable in message and "docs/install.md" in message


def test_spark_outside_the_range_is_refused() -> None:
    for version in ("3.4.4", "4.4.0", "5.0.0"):
        with pytest.raises(ConfigError, match=rf"Spark {version} is not supported.*3\.5 to < 4\.4"):
            spark_support.check_spark_version(version)
    for version in ("3.5.0", "4.0.5", "4.3.0", "4.3.1-SNAPSHOT"):
        spark_support.check_spark_version(version)
    with pytest.raises(ConfigError, match="'banana' is not of the form"):
        spark_support.spark_line("banana")


@pytest.mark.parametrize("feature", sorted(spark_support.FEATURES))
def test_a_feature_is_refused_below_its_minimum_naming_it_and_the_version(feature: str) -> None:
    spec = spark_support.FEATURES[feature]
    below = f"{spec.min_version[0]}.{spec.min_version[1] - 1}.9" if spec.min_version[1] else "3.5.9"
    with pytest.raises(ConfigError) as err:
        spark_support.require(feature, below)
    assert f"{feature} needs Spark {spec.min_text} or newer" in str(err.value) and below in str(err.value)
    spark_support.require(feature, f"{spec.min_text}.0")


def test_the_features_a_configuration_asks_for() -> None:
    check = spark_support.check_requested_features
    with pytest.raises(ConfigError, match="rescale on restore needs Spark 4.2"):
        check({spark_support.STATE_PARTITIONS_KEY: "4"}, "4.1.4")
    with pytest.raises(ConfigError, match="checkpoint format v2 needs Spark 4.0"):
        check({spark_support.CHECKPOINT_FORMAT_KEY: "2"}, "3.5.9")
    check({spark_support.CHECKPOINT_FORMAT_KEY: "1"}, "3.5.9")
    check({spark_support.STATE_PARTITIONS_KEY: "4", spark_support.CHECKPOINT_FORMAT_KEY: "2"}, "4.3.0")


def test_a_snapshot_restores_on_its_line_or_a_newer_one_never_an_older_one() -> None:
    rule = spark_support.check_restore_line
    rule("4.2.0", "4.2.1", "s3://b/sp")
    rule("3.5.9", "4.3.0", "s3://b/sp")
    rule(None, "3.5.9", "s3://b/sp")  # taken before the version was recorded
    with pytest.raises(RestoreError,
                       match=r"s3://b/sp was taken on Spark 4\.0\.5; this Spark 3\.5\.9 is an older"):
        rule("4.0.5", "3.5.9", "s3://b/sp")
