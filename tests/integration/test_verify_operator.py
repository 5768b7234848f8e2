"""`SparkpointVerifyOperator` with `dag.test()` and real ``spark-submit``.

A production run of the threshold pipeline (``dags/jobs/threshold_alerts.py``) and a
savepoint of it come from a first DAG. Then, with more input written:

* the drill restores the newest savepoint under a scratch identity and catches up: its
  alerts (in its scratch table) are exactly those the input after the savepoint raises
  given the savepoint's state (a streak that spans the savepoint alerts only if the
  state was restored), the outcome is recorded next to the savepoint, and production is
  untouched: same generation count, same Delta table, same files (but the record);
* the example DAG ``example_sparkpoint_restore_drill`` against a newer savepoint with a
  file missing fails, names the file in the record and fires its notifier;
* (slow) the example DAG's drill passes on a healthy savepoint.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.verification import read_verification
from airflow_sparkpoint.storage import open_storage
from tests.support import state_cases
from tests.support.dag_runs import new_dag, run_dag, spark_default_connection, task_state
from tests.support.inputs import sorted_delta_rows, write_json_batches
from tests.support.paths import REPO
from tests.support.trees import tree_digest

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

JOB_SCRIPT = REPO / "dags" / "jobs" / "threshold_alerts.py"
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN"}
JOB = "alerts"


def drill_files() -> list[list[dict[str, Any]]]:
    """Six files of two readings per sensor. s0's streak (95, 96 | 97) spans the savepoint
    taken after file 3: it alerts in file 4 only if the drill restored s0's buffer."""
    values = {
        "s0": [50, 50, 50, 50, 50, 50, 95, 96, 97, 50, 50, 50],
        "s1": [91, 92, 93, 50, 94, 95, 96, 50, 97, 98, 99, 50],
    }
    return [[{"sensor": s, "ts": state_cases.ts(i * 2 + j), "value": float(v[i * 2 + j])}
             for s, v in values.items() for j in range(2)] for i in range(6)]


class Production:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "sp"
        self.input = base / "readings"
        self.output = base / "alerts"
        self.files = drill_files()

    @property
    def catalog(self) -> Catalog:
        return Catalog(open_storage(str(self.root)), JOB)

    def application_args(self) -> list[str]:
        return ["--input", str(self.input), "--output", str(self.output), "--limit", str(state_cases.LIMIT),
                "--readings", str(state_cases.READINGS)]


@pytest.fixture(scope="module")
def production(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Production]:
    """Files 0-3 through the production job (spark-submit), then a savepoint of it."""
    from airflow_sparkpoint.operators import SparkpointSavepointOperator, SparkpointSubmitOperator

    with spark_default_connection():
        prod = Production(tmp_path_factory.mktemp("drill-production"))
        write_json_batches(prod.input, prod.files[:4])
        with new_dag("drill_production") as dag:
            run = SparkpointSubmitOperator(task_id="run", job_name=JOB, checkpoint_dir=str(prod.root),
                                           application=str(JOB_SCRIPT),
                                           application_args=prod.application_args(),
                                           conn_id="spark_default", conf=dict(SPARK_CONF))
            savepoint = SparkpointSavepointOperator(task_id="savepoint", job_name=JOB,
                                                    checkpoint_dir=str(prod.root))
            run >> savepoint
        dagrun = run_dag(dag)
        assert dagrun.state == "success", {t.task_id: t.state for t in dagrun.get_task_instances()}
        assert sorted_delta_rows(prod.output) == sorted(
            [a for alerts in state_cases.threshold_alerts(prod.files[:4]) for a in alerts_as_rows(alerts)],
            key=lambda r: json.dumps(r, sort_keys=True, default=str))
        yield prod


def alerts_as_rows(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Oracle alerts as the Delta table returns them (timestamps as aware datetimes)."""
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return [{**a, "first_ts": parse(a["first_ts"]), "last_ts": parse(a["last_ts"])} for a in alerts]


def test_drill_restores_the_savepoint_under_a_scratch_identity_and_leaves_production_alone(
    production, tmp_path, capsys
):
    from airflow_sparkpoint.operators import SparkpointVerifyOperator

    prod = production
    [savepoint] = prod.catalog.list_savepoints()
    write_json_batches(prod.input, prod.files[4:], start=4)  # arrived since the savepoint
    generations = prod.catalog.current_generation()
    table_before = sorted_delta_rows(prod.output)
    files_before = tree_digest(prod.root)
    drills = tmp_path / "drills"
    with new_dag("drill") as dag:
        SparkpointVerifyOperator(
            task_id="drill", job_name=JOB, checkpoint_dir=str(prod.root), snapshot="latest_savepoint",
            drill_dir=str(drills), keep_scratch=True, application=str(JOB_SCRIPT),
            application_args=prod.application_args(), output_args={"--output": "{scratch}/alerts"},
            conn_id="spark_default", conf=dict(SPARK_CONF))

    run = run_dag(dag)

    assert run.state == "success"
    [ti] = run.get_task_instances()
    summary = ti.xcom_pull(task_ids="drill")
    batch = savepoint.metadata.batch_id
    assert summary["ok"] and summary["snapshot"] == savepoint.uri and summary["batch_id"] == batch
    result = summary["result"]
    assert ((result["job"], result["generation"], result["restored_from"])
            == ("alerts-drill", 1, savepoint.uri))
    assert result["first_batch"] == batch + 1 and result["batches_processed"] == 2
    # the drill's output: exactly the alerts files 4-5 raise on top of the savepoint's state
    [drill_dir] = list(drills.iterdir())
    expected = alerts_as_rows([a for alerts in state_cases.threshold_alerts(prod.files)[4:] for a in alerts])
    assert any(a["sensor"] == "s0" for a in expected), \
        "no streak spans the savepoint: the case proves nothing"
    assert (sorted_delta_rows(drill_dir / "alerts")
            == sorted(expected, key=lambda r: json.dumps(r, sort_keys=True,
                                                  default=str)))
    # recorded next to the savepoint
    record = read_verification(prod.catalog.store, savepoint.key)
    assert record is not None and record.ok and record.level == "drill"
    assert record.verified_at == summary["verified_at"] and record.checks["batches_processed"] == 2
    capsys.readouterr()  # the DAG run's own output
    assert cli.main(["list", "--dir", str(prod.root), "--job", JOB, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["savepoints"]
    assert ((listed["uri"], listed["verified_at"], listed["verify_error"])
            == (savepoint.uri, record.verified_at, None))
    # production untouched: generations, table, files (but the record)
    assert prod.catalog.current_generation() == generations == 1
    assert sorted_delta_rows(prod.output) == table_before
    files_after = tree_digest(prod.root)
    record_key = f"{JOB}/{savepoint.key}/_verification.json"
    assert set(files_after) - set(files_before) == {record_key}
    assert {k: v for k, v in files_after.items() if k != record_key} == files_before


def run_example(monkeypatch: pytest.MonkeyPatch, prod: Production, tmp_path: Path, alerts: Path) -> Any:
    """The example DAG as a deployment runs it: storage from ``sparkpoint_default``, Spark
    settings from ``spark-defaults.conf``, only the params pointed at this test."""
    from airflow.dag_processing.dagbag import DagBag

    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SPARK_CONF.items()))
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    monkeypatch.setenv("AIRFLOW_CONN_SPARKPOINT_DEFAULT", json.dumps({"conn_type": "sparkpoint",
                                                                      "host": str(prod.root)}))
    monkeypatch.delenv("SPARKPOINT_WORK_DIR", raising=False)
    dag = DagBag(str(REPO / "dags" / "example_sparkpoint_restore_drill.py")).get_dag(
        "example_sparkpoint_restore_drill")
    return dag.test(run_conf={"job_name": JOB, "input": str(prod.input), "output": str(prod.output),
                              "drill_dir": str(tmp_path / "drills"), "alert_file": str(alerts)})


def test_example_drill_dag_fails_loudly_when_the_newest_savepoint_does_not_restore(production, tmp_path,
                                                                                     monkeypatch):
    prod = production
    catalog = prod.catalog
    broken = catalog.create_savepoint(catalog.handle(catalog.latest()))  # the newest savepoint
    lost = next(ref for ref in broken.metadata.files if ref.path.startswith("state/0/1/"))
    os.unlink(Path(broken.uri.removeprefix("file://")) / lost.key)
    generations = catalog.current_generation()
    alerts = tmp_path / "alerts.jsonl"

    run = run_example(monkeypatch, prod, tmp_path, alerts)

    assert run.state == "failed" and task_state(run, "restore_drill") == "failed"
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["task_id"] == "restore_drill" and lost.key in alert["error"], alert
    record = read_verification(catalog.store, broken.uri[len(catalog.uri) + 1:])
    assert record is not None and record.level == "drill" and lost.key in record.error
    assert catalog.current_generation() == generations
    shutil.rmtree(broken.uri.removeprefix("file://"))  # leave the healthy savepoint the newest


@pytest.mark.slow
def test_example_drill_dag_passes_on_a_healthy_savepoint(production, tmp_path, monkeypatch):
    prod = production
    [savepoint] = prod.catalog.list_savepoints()
    run = run_example(monkeypatch, prod, tmp_path, tmp_path / "alerts.jsonl")
    assert run.state == "success"
    assert not (tmp_path / "alerts.jsonl").exists()
    assert list((tmp_path / "drills").iterdir()) == [], "the drill's scratch directory was left behind"
    record = read_verification(prod.catalog.store, savepoint.key)
    assert record is not None and record.ok and record.level == "drill"
