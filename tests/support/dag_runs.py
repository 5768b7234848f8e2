"""Running DAGs built inside a test with `dag.test()` (shared by the Airflow integration
tests; they need the ``airflow_home`` fixture's metadata database)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

SPARK_DEFAULT_ENV = "AIRFLOW_CONN_SPARK_DEFAULT"


@contextmanager
def spark_default_connection(host: str = "local[2]") -> Iterator[None]:
    """Airflow's ``spark_default`` connection as a local master (``AIRFLOW_CONN_SPARK_DEFAULT``),
    restored to its previous value (or unset) on exit; usable by a fixture of any scope."""
    previous = os.environ.get(SPARK_DEFAULT_ENV)
    os.environ[SPARK_DEFAULT_ENV] = json.dumps({"conn_type": "spark", "host": host})
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SPARK_DEFAULT_ENV, None)
        else:
            os.environ[SPARK_DEFAULT_ENV] = previous


def run_dag(dag: Any, **conf: Any) -> Any:
    """`dag.test()` a DAG built in a test (serialized to the metadata DB first)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.commit()
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
    return dag.test(run_conf=conf or None)


def new_dag(name: str) -> Any:
    """An unscheduled DAG with a unique id (``test_<name>_<hex>``)."""
    from airflow.sdk import DAG

    return DAG(dag_id=f"test_{name}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime(2026, 1, 1),
               catchup=False)


def task_state(run: Any, task_id: str) -> str:
    [ti] = [t for t in run.get_task_instances() if t.task_id == task_id]
    return str(ti.state)


def task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
