"""The one home of the helpers shared by the test suites (test modules and ``conftest.py``
files import from here, never from a ``conftest.py``):

- `paths`: the repository's root;
- `servers`: the servers (Spark, moto, SeaweedFS) and `package_fixtures` to declare them;
- `waits`: waiting for a condition;
- `inputs`: a job's input files and the oracle of a keyed-totals job;
- `submit`: running ``spark-submit``; `rescale_runs`: the rescale job's runs;
- `records`: one builder per record kind (checkpoints, transaction records, status
  records), written directly into a catalog;
- `delta_staging`: the two staging sides of `DeltaSink`;
- `state_cases`: the stateful jobs of the state tests;
- `dag_runs`: running a DAG built in a test; `triggers`: a trigger that reads the backlog once;
- `ui_stack`: the Airflow API server and history of the UI tests.
"""
