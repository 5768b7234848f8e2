"""Airflow triggers of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.triggers.assets import SparkpointCommitTrigger, SparkpointSavepointTrigger
from airflow_sparkpoint.triggers.checkpoint import SparkpointCheckpointTrigger

__all__ = ["SparkpointCheckpointTrigger", "SparkpointCommitTrigger", "SparkpointSavepointTrigger"]
