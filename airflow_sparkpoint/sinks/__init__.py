"""Two-phase-commit sinks. Importing this package needs neither Spark nor Airflow;
Spark is imported only when a batch is staged."""

from __future__ import annotations

from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext, sink_from_config
from airflow_sparkpoint.sinks.delta import DeltaSink

__all__ = ["CommitOutcome", "DeltaSink", "Sink", "StageContext", "sink_from_config"]

try:  # written alongside; present once their modules land
    from airflow_sparkpoint.sinks.directory import DirectorySink  # noqa: F401
    from airflow_sparkpoint.sinks.s3 import S3Sink  # noqa: F401

    __all__ += ["DirectorySink", "S3Sink"]
except ImportError:  # pragma: no cover
    pass
