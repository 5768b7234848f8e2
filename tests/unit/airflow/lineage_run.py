"""Run by `test_openlineage.py` in a process of its own (OpenLineage reads its configuration
once per process): `dag.test()` of a DAG with a commit step and a submit task whose
``spark-submit`` is a stand-in recording its arguments (argv[2]), with the job store at
argv[1]. OpenLineage's listener writes its events to the file transport the caller set."""

from __future__ import annotations

import sys

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.operators import SparkpointCommitOperator, SparkpointSubmitOperator
from airflow_sparkpoint.storage import open_storage
from tests.support.dag_runs import new_dag, run_dag, task_states
from tests.support.fake_sinks import LocatedSink
from tests.support.records import confirm, transaction_record


def main() -> None:
    from airflow.utils import db

    db.resetdb()
    root, job = sys.argv[1], "orders"
    catalog = Catalog(open_storage(root), job)
    catalog.claim_generation()
    sink = LocatedSink("w-lineage")
    confirm(catalog, transaction_record(sink, 0, job=job), transaction_record(sink, 1, job=job))
    with new_dag("lineage") as dag:
        commit = SparkpointCommitOperator(task_id="commit", job_name=job, checkpoint_dir=root, sink=sink)
        submit = SparkpointSubmitOperator(task_id="submit", application="/nonexistent/job.py",
                                          conn_id="spark_default",
                                          job_name=job, checkpoint_dir=root, sink=sink,
                                          conf={"spark.sql.shuffle.partitions": "2"})
        commit >> submit
    run = run_dag(dag)
    print("SPARKPOINT_STATES", task_states(run), flush=True)


if __name__ == "__main__":
    main()
