"""The README's snippet is complete and runnable (issue #48): its job script, its DAG and
its pool command, written where the README says, make a DAG Airflow parses whose
application is the job script, a pool of one slot, and a job that runs to its result
through ``spark-submit``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.submit import spark_submit_command, submit_env


def snippets() -> tuple[str, str, str]:
    """The README's job script, DAG file and pool command (the blocks after their captions)."""
    text = (REPO / "README.md").read_text()

    def block_after(caption: str, language: str) -> str:
        at = text.index(caption)
        match = re.compile(rf"```{language}\n(.*?)```", re.DOTALL).search(text, at)
        assert match, f"no ```{language} block after {caption!r}"
        return match.group(1)

    return (block_after("The job, `dags/jobs/orders.py`", "python"),
            block_after("The DAG, `dags/orders.py`", "python"), block_after("the one-slot pool", "bash"))


def project(base: Path) -> Path:
    """The README's files under `base`/dags, as it lays them out."""
    job, dag, _pool = snippets()
    (base / "dags" / "jobs").mkdir(parents=True)
    (base / "dags" / "jobs" / "orders.py").write_text(job)
    (base / "dags" / "orders.py").write_text(dag)
    (base / "dags" / ".airflowignore").write_text("jobs/\n")
    return base / "dags"


@pytest.mark.airflow
def test_the_readmes_dag_parses_and_its_application_is_the_job_script(
    airflow_home: Path, tmp_path: Path
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_sparkpoint.operators.submit_checks import resolve_application

    dags = project(tmp_path)
    bag = DagBag(str(dags))
    assert bag.import_errors == {} and list(bag.dag_ids) == ["orders"], (bag.import_errors, bag.dag_ids)
    (task,) = bag.get_dag("orders").tasks
    assert (resolve_application(task.application, bag.get_dag("orders").fileloc)
            == str(dags / "jobs" / "orders.py"))
    assert (task.pool, task.retries) == ("sparkpoint_orders", 2)

    _job, _dag, pool = snippets()
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    subprocess.run(["bash", "-euo", "pipefail", "-c", pool], env=env, check=True, capture_output=True,
                   timeout=300)
    shown = subprocess.run(["airflow", "pools", "get", "sparkpoint_orders", "-o", "json"], env=env,
                           check=True, capture_output=True, text=True, timeout=300)
    assert json.loads(shown.stdout)[0]["slots"] in (1, "1"), shown.stdout


@pytest.mark.spark
def test_the_readmes_job_runs_to_its_result(tmp_path: Path) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook

    dags = project(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.json").write_text('{"user": "ana", "amount": 5}\n{"user": "bo", "amount": 7}\n'
                                            '{"user": "ana", "amount": 3}\n')
    env = submit_env()
    conf = {"spark.sparkpoint.dir": str(tmp_path / "checkpoints"), "spark.sparkpoint.job": "orders",
            "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
    command = spark_submit_command(dags / "jobs" / "orders.py", conf,
                                   ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "totals")],
                                   env=env)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("SPARKPOINT_RESULT ")]
    assert json.loads(line.removeprefix("SPARKPOINT_RESULT "))["status"] == "finished", line
    rows = SparkpointHook(None,
                          storage_uri=str(tmp_path / "checkpoints")).delta_rows(str(tmp_path / "totals"))
    assert {r["user"]: r["total"] for r in rows} == {"ana": 8, "bo": 7}
