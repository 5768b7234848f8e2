"""The quickstart pipeline (``dags/jobs/quickstart_totals.py``, a streaming aggregation on
RocksDB state), then a look into the driver's JVM once `SparkpointJob.run` returned: are
state stores still loaded there (Spark's maintenance task runs while any is)? Printed as
``STATE_STORES {"maintenance_running": ...}`` before `SparkpointJob.main` reports the run
and exits."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from airflow_sparkpoint.runtime import SparkpointJob

QUICKSTART = Path(__file__).resolve().parents[3] / "dags" / "jobs" / "quickstart_totals.py"


def main(job: SparkpointJob) -> None:
    spec = importlib.util.spec_from_file_location("quickstart_totals", QUICKSTART)
    assert spec is not None and spec.loader is not None
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    quickstart.main(job)
    store = job.spark.sparkContext._jvm.org.apache.spark.sql.execution.streaming.state.StateStore
    print("STATE_STORES " + json.dumps({"maintenance_running": bool(store.isMaintenanceRunning())}),
          flush=True)


if __name__ == "__main__":
    SparkpointJob.main(main, app_name="sparkpoint-state-store-probe")
