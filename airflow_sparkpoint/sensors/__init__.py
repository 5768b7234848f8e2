"""Airflow sensors of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.sensors.checkpoint import SparkpointCheckpointSensor

__all__ = ["SparkpointCheckpointSensor"]
