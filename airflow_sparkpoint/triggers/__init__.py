"""Airflow triggers of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.triggers.assets import SparkpointCommitTrigger, SparkpointSavepointTrigger
from airflow_sparkpoint.triggers.checkpoint import SparkpointCheckpointTrigger
from airflow_sparkpoint.triggers.cutover import SparkpointCutoverTrigger
from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

__all__ = ["SparkpointCheckpointTrigger", "SparkpointCommitTrigger", "SparkpointCutoverTrigger",
           "SparkpointRunTrigger", "SparkpointSavepointTrigger"]
