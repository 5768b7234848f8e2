"""Where the Spark lines differ in an API the sinks use: the one place that knows (the
runtime's feature table is `airflow_sparkpoint.runtime.spark_support`, which parses
versions with `spark_line` from here)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_sparkpoint.exceptions import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["arrow_schema", "collect_arrow", "spark_line"]


def spark_line(version: str) -> tuple[int, int]:
    """(major, minor) of a Spark version string such as ``3.5.9`` or ``4.3.0-SNAPSHOT``.

    :raises ConfigError: `version` does not start with ``<major>.<minor>``.
    """
    match = re.match(r"\s*(\d+)\.(\d+)", version or "")
    if match is None:
        raise ConfigError(f"Spark version {version!r} is not of the form <major>.<minor>[.<patch>]")
    return int(match.group(1)), int(match.group(2))


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, with Spark's TimestampType as a UTC instant
    (like Delta's timestamp) on every line: 4.2 added ``timezone=`` (and dropped 4.0/4.1's
    ``timestamp_utc=``); 3.5 to 4.1 convert to UTC by default."""
    import pyspark
    from pyspark.sql.pandas.types import to_arrow_schema

    if spark_line(pyspark.__version__) >= (4, 2):
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


def collect_arrow(df: DataFrame) -> pa.Table:
    """All rows of `df` on the driver as an Arrow table. ``DataFrame.toArrow`` came in 4.0;
    on 3.5 this does what 4.0's does, through the same private collector
    (``_collect_as_arrow``, there since 2.3), cast to the UTC schema of `arrow_schema`.

    :raises Exception: whatever Spark raised (e.g. the result exceeds ``spark.driver.maxResultSize``).
    """
    import pyspark

    if spark_line(pyspark.__version__) >= (4, 0):
        return df.toArrow()
    schema = arrow_schema(df.schema)
    batches = df._collect_as_arrow()  # type: ignore[operator]  # 3.5: [] for no rows; typed as a Column on 4.x
    if not batches:
        return schema.empty_table()
    import pyarrow as pa

    return pa.Table.from_batches(batches).cast(schema)
