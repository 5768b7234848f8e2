"""OpenLineage with the provider installed and a file transport: the commit step's event
names the sink's dataset (named as its asset) and carries the ``sparkpoint`` run facet,
and the submit operator keeps the Spark provider's parent-job injection in the
``spark-submit`` command next to its own ``spark.sparkpoint.*`` conf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.airflow


def test_dataset_names_follow_airflows_asset_converters(airflow_home: Path) -> None:
    from airflow_sparkpoint.operators import lineage

    assert lineage.dataset_name("s3://lake-bucket/tables/orders") == ("s3://lake-bucket", "tables/orders")
    assert lineage.dataset_name("file:///data/out") == ("file", "/data/out")
    assert (lineage.dataset_name("sparkpoint://sp/orders/savepoints")
            == ("sparkpoint://sp", "/orders/savepoints"))


def test_openlineage_events_name_the_sink_and_carry_the_sparkpoint_facet(tmp_path: Path) -> None:
    events_file, argv_file = tmp_path / "events.jsonl", tmp_path / "spark-submit.argv"
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (tmp_path / "home").mkdir()
    fake = fakes / "spark-submit"  # records its command line; a job that never starts
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_file}\n')
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(fakes), os.environ.get("PATH", os.defpath)]),
        # A database of its own: this process's Airflow may have read another home.
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/home/airflow.db",
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                       "append": True}),
        "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "True",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]"}),
    }
    done = subprocess.run([sys.executable, "-m", "tests.unit.airflow.lineage_run", str(tmp_path / "sp")],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SPARKPOINT_STATES {'commit': 'success', 'submit': 'success'}" in done.stdout, done.stdout[-3000:]

    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    complete: dict[str, Any] = {e["job"]["name"].rsplit(".", 1)[-1]: e for e in events
                                if e["eventType"] == "COMPLETE" and "." in e["job"]["name"]}
    commit = complete["commit"]
    assert commit["outputs"] == [{"facets": {}, "namespace": "file", "name": "/fake-sinks/w-lineage"}], commit
    facet = commit["run"]["facets"]["sparkpoint"]
    assert (facet["job"], facet["generation"], facet["committed_batches"]) == ("orders", 1, [0, 1]), facet
    assert facet["last_checkpoint"].endswith("/orders/chk-1"), facet
    submit = complete["submit"]
    assert submit["outputs"] == commit["outputs"] and submit["run"]["facets"]["sparkpoint"]["job"] == "orders"

    argv = argv_file.read_text().splitlines()
    conf = {argv[i + 1].split("=", 1)[0]: argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv)
            if a == "--conf"}
    assert conf["spark.sparkpoint.job"] == "orders" and conf["spark.sql.shuffle.partitions"] == "2", conf
    assert conf["spark.openlineage.parentJobName"].endswith(".submit"), conf
    assert conf["spark.openlineage.parentRunId"] == submit["run"]["runId"], (conf, submit["run"]["runId"])
