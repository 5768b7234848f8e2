"""Airflow operators of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.operators.submit import SparkpointSubmitOperator

__all__ = ["SparkpointSubmitOperator"]
