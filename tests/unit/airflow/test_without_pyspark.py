"""The Airflow side imports without pyspark (issue #29): every module of the operators,
sensors, triggers, hooks, UI plugin, CLI and services, the provider info and the example DAGs, in a
fresh interpreter where ``import pyspark`` fails, as on an Airflow worker that has neither
pyspark nor the Spark provider's pyspark-client. The import-linter contract
``airflow-side-without-pyspark`` forbids direct imports; this test covers import time,
including what the Airflow side reaches of the runtime and the sinks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
AIRFLOW_SIDE = ("operators", "sensors", "triggers", "hooks", "plugins", "cli", "services")

CODE = f"""
import importlib, pkgutil, runpy, sys
sys.modules["pyspark"] = None  # `import pyspark` and `import pyspark.sql` raise ImportError
import airflow_sparkpoint
names = ["airflow_sparkpoint.cli", "airflow_sparkpoint.get_provider_info"]
for package in {AIRFLOW_SIDE!r}:
    module = importlib.import_module("airflow_sparkpoint." + package)
    names += [info.name for info in pkgutil.walk_packages(module.__path__, module.__name__ + ".")]
for name in names:
    importlib.import_module(name)
for dag in sys.argv[1:]:
    runpy.run_path(dag)
print(len(names), "modules", len(sys.argv) - 1, "dags")
"""


def test_the_airflow_side_and_the_example_dags_import_without_pyspark(tmp_path: Path) -> None:
    dags = sorted(str(p) for p in (REPO / "dags").glob("*.py"))
    assert dags, "no example DAG found"
    env = {**os.environ, "PYTHONPATH": str(REPO), "AIRFLOW_HOME": str(tmp_path),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db"}
    result = subprocess.run([sys.executable, "-c", CODE, *dags], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"{len(dags)} dags" in result.stdout, result.stdout
