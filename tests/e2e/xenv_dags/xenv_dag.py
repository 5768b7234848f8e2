"""The cross-environment test's DAG (``tests/e2e/test_e2e_cross_env.py``), parsed and run
inside the Airflow environment without pyspark (``.venvs/airflow-nospark``): it imports
only Airflow and the installed provider, never the tests.

Its `SparkpointSubmitOperator` reaches Spark only through the worker's environment and the
connections the test sets: ``spark-submit`` on ``PATH`` from ``SPARK_HOME`` (the Spark
line's environment), the ``sparkpoint_default`` connection's storage root and
``pyspark_python`` (that environment's Python). The runtime reaches the driver and the
executors through ``ship_runtime`` (``--py-files``); the job's libraries are the Spark
environment's own.

Run as ``python xenv_dag.py '<run conf as JSON>'``: `dag.test()` of one run, then a line
``XENV_RESULT {...}`` with the run's and the task's states and the task's try number.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_sparkpoint.operators import SparkpointSubmitOperator

JOB = str(Path(__file__).resolve().parents[1] / "dags" / "jobs" / "e2e_totals.py")

with DAG(dag_id="xenv_submit", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, params={
    "job_name": Param("xenv", type="string"),
    "input": Param("/nonexistent/input", type="string"),
    "output": Param("/nonexistent/output", type="string"),
    "restore": Param("latest", type="string"),
    "trigger": Param("availableNow", type="string"),
}) as dag:
    SparkpointSubmitOperator(
        task_id="job",
        conn_id="spark_default",
        sparkpoint_conn_id="sparkpoint_default",
        application=JOB,
        application_args=["--input={{ params.input }}", "--output={{ params.output }}",
                          "--files-per-batch=1"],
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
              "spark.driver.host": "127.0.0.1", "spark.log.level": "WARN"},
        job_name="{{ params.job_name }}",
        restore="{{ params.restore }}",
        trigger="{{ params.trigger }}",
        sparkpoint_conf={"control.pollInterval": "0.5s"},
        ship_runtime=True,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

if __name__ == "__main__":
    run = dag.test(run_conf=json.loads(sys.argv[1]))
    (ti,) = run.get_task_instances()
    print("XENV_RESULT "
          + json.dumps({"run": str(run.state), "task": str(ti.state), "try_number": ti.try_number}),
          flush=True)
