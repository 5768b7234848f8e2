"""Two-phase-commit sinks. Importing this package needs neither Spark nor Airflow;
Spark is imported only when a batch is staged."""

from __future__ import annotations

from airflow_sparkpoint.sinks.base import CommitOutcome, Sink, StageContext
from airflow_sparkpoint.sinks.delta import DeltaSink
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.registry import sink_from_config
from airflow_sparkpoint.sinks.s3 import S3Sink

__all__ = ["CommitOutcome", "DeltaSink", "DirectorySink", "S3Sink", "Sink", "StageContext",
           "sink_from_config"]
