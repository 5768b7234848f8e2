"""Airflow operators of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.operators.commit import SparkpointCommitOperator
from airflow_sparkpoint.operators.cutover import SparkpointCutoverOperator
from airflow_sparkpoint.operators.health import SparkpointHealthCheckOperator
from airflow_sparkpoint.operators.preflight import SparkpointPreflightOperator
from airflow_sparkpoint.operators.savepoint import SparkpointSavepointOperator
from airflow_sparkpoint.operators.submit import SparkpointSubmitOperator
from airflow_sparkpoint.operators.verify import SparkpointDrillOperator, SparkpointVerifyOperator

__all__ = [
    "SparkpointCommitOperator",
    "SparkpointCutoverOperator",
    "SparkpointDrillOperator",
    "SparkpointHealthCheckOperator",
    "SparkpointPreflightOperator",
    "SparkpointSavepointOperator",
    "SparkpointSubmitOperator",
    "SparkpointVerifyOperator",
]
