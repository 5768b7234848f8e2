"""One function per use case, between the core (storage, checkpoints, sinks, runtime)
and the front ends (operators, sensors, triggers, the UI plugin, the demo, the CLI).

Every front end reaches the core through these modules (an import-linter contract in
pyproject.toml says so); none imports Airflow (the CLI and the operators both use them)
or, at import time, PySpark.
"""
