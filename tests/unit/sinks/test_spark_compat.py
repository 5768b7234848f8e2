"""`sinks.spark_compat`: the Arrow schema of a Spark schema is the same on every Spark
line (4.2 renamed the UTC argument of pyspark's converter; issue #29). Runs without a
JVM, in the default environment and in each `make test-matrix` environment. `collect_arrow`
(driver staging) is exercised on every line by tests/integration/test_delta_sink.py
(`test_every_column_type_reads_back_the_same_from_either_staging_side`)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampNTZType, TimestampType

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.sinks.spark_compat import arrow_schema, spark_line


def test_timestamps_are_utc_instants_and_ntz_stays_local() -> None:
    schema = StructType([StructField("user", StringType()), StructField("total", LongType(), False),
                         StructField("at", TimestampType()), StructField("local", TimestampNTZType())])
    assert arrow_schema(schema) == pa.schema([
        pa.field("user", pa.string()), pa.field("total", pa.int64(), nullable=False),
        pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("local", pa.timestamp("us")),
    ])


def test_spark_line() -> None:
    assert spark_line("3.5.9") == (3, 5) and spark_line("4.3.0-SNAPSHOT") == (4, 3)
    with pytest.raises(ConfigError, match="'x.y' is not of the form"):
        spark_line("x.y")

