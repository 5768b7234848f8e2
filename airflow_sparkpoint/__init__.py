"""Flink-grade checkpoints, savepoints and exactly-once output for PySpark, from Airflow.

This module imports neither Airflow nor PySpark so that the Spark-side runtime can be
shipped to a cluster without the Airflow dependencies.
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"
