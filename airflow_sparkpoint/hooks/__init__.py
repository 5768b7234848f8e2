"""Airflow hooks of the Sparkpoint provider."""

from __future__ import annotations

from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook

__all__ = ["SparkpointHook"]
