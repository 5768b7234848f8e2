"""The Spark-side runtime: runs in the driver, never imports Airflow."""

from __future__ import annotations

from airflow_sparkpoint.runtime.config import SparkpointConfig, Trigger
from airflow_sparkpoint.runtime.job import RunResult, SparkpointJob

__all__ = ["RunResult", "SparkpointConfig", "SparkpointJob", "Trigger"]
