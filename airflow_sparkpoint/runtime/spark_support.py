"""What the runtime needs in the Spark driver, and what each Spark line can do: the one
home of the supported Spark range, the runtime's third-party libraries, the feature table
(feature -> minimum Spark version) and the rule for restoring a snapshot taken on another
Spark line.

Checked at startup (`SparkpointJob.get_or_create`), before anything is written:
`check_runtime_libraries` (before the JVM starts), then `check_spark_version` and
`check_requested_features` once the session is there. `check_restore_line` runs when a
restore target is chosen (`runtime.run_startup`). docs/install.md says the same for users;
`scripts/compatibility.py` prints `FEATURES` into docs/compatibility.md.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_sparkpoint.exceptions import ConfigError, RestoreError
from airflow_sparkpoint.sinks.spark_compat import spark_line

__all__ = ["FEATURES", "RUNTIME_REQUIREMENTS", "SPARK_RANGE", "Feature", "spark_line"]

# The Spark lines the runtime runs on: [lowest, highest) as (major, minor).
SPARK_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((3, 5), (4, 4))

# Import name -> requirement: the `runtime` extra of pyproject.toml, the same list
# (tests/unit/runtime/test_spark_support.py keeps them equal).
RUNTIME_REQUIREMENTS: Mapping[str, str] = {
    "deltalake": "deltalake>=1.2,<2",
    "pyarrow": "pyarrow>=15",
    "boto3": "boto3>=1.34",
    "pandas": "pandas>=2.2,<3",
}

STATE_PARTITIONS_KEY = "spark.sparkpoint.restore.statePartitions"
CHECKPOINT_FORMAT_KEY = "spark.sql.streaming.stateStore.checkpointFormatVersion"
SNAPSHOT_REPAIR_KEY = "spark.sql.streaming.stateStore.autoSnapshotRepair.enabled"
#: the first line whose state stores fall back to an older snapshot when the newest fails to load
SNAPSHOT_REPAIR_SINCE = (4, 1)


@dataclass(frozen=True)
class Feature:
    """A runtime feature that needs a newer Spark than the range's lowest line."""

    name: str
    min_version: tuple[int, int]
    needs: str  # the Spark API that sets the minimum
    # True: the runtime refuses it from the job's settings (`check_requested_features`,
    # `require`). False: a job builds it with a PySpark API that older lines do not have,
    # so the query cannot be built there (AttributeError/ImportError before anything is written).
    refused_by_runtime: bool = True

    @property
    def min_text(self) -> str:
        return ".".join(map(str, self.min_version))


FEATURES: Mapping[str, Feature] = {f.name: f for f in (
    Feature("rescale on restore", (4, 2),
            f"{STATE_PARTITIONS_KEY}: Spark's offline state repartitioner "
            "(SparkSession._streamingCheckpointManager)"),
    Feature("transformWithState", (4, 0), "GroupedData.transformWithStateInPandas", refused_by_runtime=False),
    Feature("Python data sources", (4, 0), "pyspark.sql.datasource (spark.dataSource.register)",
            refused_by_runtime=False),
    Feature("checkpoint format v2", (4, 0), f"{CHECKPOINT_FORMAT_KEY}=2"),
    Feature("state inspect and verify", (4, 0), "the state-metadata and statestore data sources"),
)}


def _line_text(line: tuple[int, int]) -> str:
    return f"{line[0]}.{line[1]}"


def missing_runtime_libraries() -> list[str]:
    """The requirements of `RUNTIME_REQUIREMENTS` whose module this Python cannot import."""
    return [req for module, req in RUNTIME_REQUIREMENTS.items() if importlib.util.find_spec(module) is None]


def check_runtime_libraries() -> None:
    """Fail in the driver, before Spark starts, when a library of the runtime is missing.

    :raises ConfigError: names every missing library, the interpreter and how to install them.
    """
    missing = missing_runtime_libraries()
    if importlib.util.find_spec("pyspark") is None:
        missing.insert(0, f"pyspark (the cluster's Spark, {_line_text(SPARK_RANGE[0])} to < "
                          f"{_line_text(SPARK_RANGE[1])})")
    if missing:
        raise ConfigError(
            f"the Sparkpoint runtime is missing {', '.join(missing)} in the driver's "
            f"Python {sys.executable}; "
            "install them in the Spark environment (pip install "
            "'airflow-sparkpoint[runtime]' or the packages "
            "above) or ship them as an archive (--archives with a venv-pack; see docs/install.md)"
        )


def check_spark_version(version: str) -> None:
    """:raises ConfigError: Spark `version` is outside `SPARK_RANGE`."""
    line = spark_line(version)
    low, high = SPARK_RANGE
    if not low <= line < high:
        raise ConfigError(
            f"Spark {version} is not supported by the Sparkpoint runtime; expected a Spark line from "
            f"{_line_text(low)} to < {_line_text(high)} (docs/install.md)"
        )


def require(feature: str, version: str) -> None:
    """:raises ConfigError: Spark `version` is older than `feature`'s minimum; the message
    names the feature and the minimum version."""
    spec = FEATURES[feature]
    if spark_line(version) < spec.min_version:
        raise ConfigError(
            f"{spec.name} needs Spark {spec.min_text} or newer ({spec.needs}); this Spark is {version}. "
            f"Run the job on Spark >= {spec.min_text}, or leave the feature off"
        )


def check_requested_features(conf: Mapping[str, str], version: str) -> None:
    """Refuse the features that the job's configuration asks for and Spark `version` lacks.

    :raises ConfigError: see `require`.
    """
    if conf.get(STATE_PARTITIONS_KEY):
        require("rescale on restore", version)
    if str(conf.get(CHECKPOINT_FORMAT_KEY, "1")).strip() not in ("", "1"):
        require("checkpoint format v2", version)


def snapshot_repair(version: str, enabled: str | None) -> bool:
    """Whether Spark `version` repairs a state store whose newest snapshot fails to load, by
    loading an older one and replaying more changelogs (4.1 and newer, unless
    `SNAPSHOT_REPAIR_KEY`, whose value is `enabled`, is false): a restore then keeps the
    versions that fallback reads (`livedir.unread_at_restart`)."""
    return spark_line(version) >= SNAPSHOT_REPAIR_SINCE and str(enabled or "true").strip().lower() != "false"


def check_restore_line(snapshot_version: str | None, running_version: str, uri: str) -> None:
    """Spark reads the checkpoints of its own line and of older lines (its state stores,
    offset and commit logs are upgraded forward), not those written by a newer line, whose
    formats (operator metadata v2, state schema v3, checkpoint format v2) an older Spark
    misreads or rejects halfway. So a snapshot restores on the Spark line that took it or
    a newer one, and an older line refuses it before anything is written. A snapshot
    without a recorded version (taken before the runtime recorded it) is let through.

    :raises RestoreError: the snapshot was taken on a newer Spark line than the running one.
    """
    if not snapshot_version:
        return
    taken, running = spark_line(snapshot_version), spark_line(running_version)
    if taken > running:
        raise RestoreError(
            f"restore target {uri} was taken on Spark {snapshot_version}; this Spark "
            f"{running_version} is an older "
            f"line and would misread its state and logs. Restore it on Spark {_line_text(taken)} or newer "
            "(docs/install.md, 'Savepoints across Spark lines')"
        )
