"""A DAG in one environment, Spark in another (issue #29).

The Airflow side runs in ``.venvs/airflow-nospark`` (`make airflow-env`: Airflow and the
provider installed from the source tree, no ``pyspark`` importable at all); the DAG
(``xenv_dags/xenv_dag.py``) runs there with `dag.test()`, in that environment's
interpreter with an AIRFLOW_HOME of its own. Its `SparkpointSubmitOperator` reaches Spark
3.5 in ``.venvs/spark-3.5`` (`make spark-envs`: that line's pyspark and the runtime's
libraries, neither Airflow nor this package) only as a worker would: ``spark-submit`` on
``PATH`` from ``SPARK_HOME``, the ``sparkpoint_default`` connection's storage root and
``pyspark_python``, the runtime shipped with ``--py-files`` (``ship_runtime``).

* the driver is SIGKILLed after batch 2 is confirmed; Airflow's retry resumes after the
  last checkpoint and the merged totals are exact;
* a streaming run is stopped with a savepoint (the ``sparkpoint`` CLI of the Airflow
  environment); a second run restores that savepoint and the totals are exact.

Slow (it builds both environments when absent, about a minute each with uv's cache, and
starts four Spark drivers): ``make test-e2e`` / ``make test-all``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.totals_pipeline import Totals, result_of, running_with_checkpoint
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.airflow]

LINE = "3.5"
AIRFLOW_ENV = REPO / ".venvs" / "airflow-nospark"
SPARK_ENV = REPO / ".venvs" / f"spark-{LINE}"
DAG_FILE = Path(__file__).resolve().parent / "xenv_dags" / "xenv_dag.py"
TIMEOUT_S = 900


@dataclass
class Envs:
    """The two environments and the Airflow worker's process environment."""

    spark_home: str
    spark_python: str
    worker: dict[str, str]

    @property
    def airflow_python(self) -> str:
        return str(AIRFLOW_ENV / "bin" / "python")

    def with_connections(self, pipeline: Totals) -> dict[str, str]:
        """The worker's environment with the two connections of `pipeline`."""
        sparkpoint = {"conn_type": "sparkpoint", "host": f"file://{pipeline.root}",
                      "extra": {"pyspark_python": self.spark_python}}
        return {**self.worker, "AIRFLOW_CONN_SPARKPOINT_DEFAULT": json.dumps(sparkpoint)}


def clean_environment() -> dict[str, str]:
    """This process's environment without what points into the development venv or the
    source tree (the suite sets PYSPARK_*; PYTHONPATH holds the checkout)."""
    drop = ("AIRFLOW", "_AIRFLOW", "PYSPARK_", "SPARKPOINT_", "SPARK_", "VIRTUAL_ENV", "PYTHON")
    env = {key: value for key, value in os.environ.items() if not key.startswith(drop)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep)
                                  if not (Path(p) / "spark-submit").exists()
                                  and Path(p) != Path(sys.executable).parent)
    return env


def check(command: list[str], env: Mapping[str, str], *, timeout: float = 300) -> str:
    """Run `command`; its exit code must be 0. Returns its stdout."""
    result = subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                            check=False)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Envs:
    """Both environments, built through the Makefile when absent (idempotent: a no-op when
    they are up to date), and an AIRFLOW_HOME with a migrated metadata database."""
    uv = Path(sys.executable).parent / "uv"
    make = ["make", "airflow-env", "spark-envs", f"SPARK_LINES={LINE}",
            *([f"UV={uv}"] if uv.exists() else [])]
    check(make, clean_environment(), timeout=1800)
    env = clean_environment()

    # The Airflow side's environment has no pyspark (nor pyspark-client's `pyspark`).
    probe = subprocess.run([str(AIRFLOW_ENV / "bin" / "python"), "-c", "import pyspark"], env=env, cwd="/",
                           capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "No module named 'pyspark'" in probe.stderr, probe
    # The Spark side's environment has the line's pyspark, and neither Airflow nor this package.
    spark_python = str(SPARK_ENV / "bin" / "python")
    where = "import os, pyspark; print(os.path.dirname(pyspark.__file__), pyspark.__version__)"
    spark_home, version = check([spark_python, "-c", where], env).split()
    assert version.startswith(f"{LINE}."), version
    for name in ("airflow", "airflow_sparkpoint"):
        probe = subprocess.run([spark_python, "-c", f"import {name}"], env=env, cwd="/", capture_output=True,
                               check=False)
        assert probe.returncode != 0, f"{SPARK_ENV} can import {name}"

    home = tmp_path_factory.mktemp("xenv-airflow-home")
    worker = {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # The worker's Spark: the line's distribution (pip's pyspark is one) on PATH.
        "SPARK_HOME": spark_home,
        "PATH": f"{spark_home}/bin{os.pathsep}{env['PATH']}",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    }
    check([str(AIRFLOW_ENV / "bin" / "airflow"), "db", "migrate"], worker)
    return Envs(spark_home, spark_python, worker)


class DagRun:
    """One `dag.test()` of ``xenv_submit`` in the Airflow environment, in the background."""

    def __init__(self, envs: Envs, env: Mapping[str, str], conf: Mapping[str, Any], log: Path) -> None:
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([envs.airflow_python, str(DAG_FILE), json.dumps(dict(conf))],
                                     env=dict(env),
                                     cwd=log.parent, stdout=self._out, stderr=subprocess.STDOUT, text=True)

    def wait(self) -> dict[str, Any]:
        """Wait for the run's end; its process must exit 0. Returns the ``XENV_RESULT``."""
        try:
            code = self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"dag.test() did not end within {TIMEOUT_S} s:\n{self.tail()}") from None
        finally:
            self._out.close()
        assert code == 0, f"dag.test() exited {code}:\n{self.tail()}"
        lines = [line for line in self.output.splitlines() if line.startswith("XENV_RESULT ")]
        assert len(lines) == 1, self.tail()
        return dict(json.loads(lines[0].removeprefix("XENV_RESULT ")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def test_a_sigkilled_driver_in_the_spark_environment_is_resumed_by_airflows_retry_with_exact_totals(
    envs: Envs, tmp_path: Path, request: Any
) -> None:
    pipeline = Totals(tmp_path, "xenv_killed")
    pipeline.write_many(5)
    marker = tmp_path / "fault-fired"
    env = {**envs.with_connections(pipeline), "SPARKPOINT_TEST_FAULT": "confirmed:2",
           "SPARKPOINT_TEST_FAULT_ONCE": str(marker)}
    run = DagRun(envs, env, {"job_name": pipeline.job, "input": str(pipeline.input),
                             "output": str(pipeline.output)}, tmp_path / "dag-test.log")
    request.addfinalizer(run.stop)
    outcome = run.wait()

    assert marker.read_text().strip() == "confirmed:2", "the first try's driver was not killed"
    output = run.output
    # the first try's spark-submit died of the SIGKILL, the retry's ended 0 (the task succeeded)
    assert "Error code is: -9" in output or "Error code is: 137" in output, run.tail()
    assert outcome == {"run": "success", "task": "success", "try_number": 2}, (outcome, run.tail())
    assert result_of(pipeline, 1) is None, "the killed driver wrote a run result"
    result = result_of(pipeline, 2)
    assert result is not None and result["status"] == "finished", result
    assert result["first_batch"] == 2 and result["last_batch"] == 4, f"the retry did not resume: {result}"
    latest = pipeline.catalog.latest()
    assert latest is not None and str(latest.spark.get("version")).startswith(f"{LINE}."), latest
    pipeline.assert_exact()  # the oracle from the input, no batch twice, no staged output left


def test_a_stop_with_savepoint_and_a_restore_from_it_across_environments_are_exact(
    envs: Envs, tmp_path: Path, request: Any
) -> None:
    pipeline = Totals(tmp_path, "xenv_savepoint")
    pipeline.write_many(3)
    env = envs.with_connections(pipeline)
    conf = {"job_name": pipeline.job, "input": str(pipeline.input), "output": str(pipeline.output)}
    stream = DagRun(envs, env, {**conf, "trigger": "processingTime:1 second"}, tmp_path / "stream.log")
    request.addfinalizer(stream.stop)
    wait_for("the stream's checkpoint of batch 2", lambda: running_with_checkpoint(pipeline, 2), TIMEOUT_S,
             stream.tail, proc=stream.proc)

    # stop-with-savepoint from the Airflow environment's CLI (no pyspark there either)
    stopped = json.loads(check([str(AIRFLOW_ENV / "bin" / "sparkpoint"), "savepoint", "--dir",
                                f"file://{pipeline.root}", "--job", pipeline.job, "--stop", "--json",
                                "--timeout", "300"], env))
    assert stopped["kind"] == "stop" and stopped["state"] == "completed" and stopped["batch_id"] == 2, stopped
    assert stream.wait() == {"run": "success", "task": "success", "try_number": 1}, stream.tail()
    first = result_of(pipeline, 1)
    assert (first is not None and first["status"] == "stopped"
            and first["savepoint"] == stopped["savepoint"]), first
    pipeline.assert_exact()  # the oracle from the input, no batch twice, no staged output left

    pipeline.write_many(3)
    restored = DagRun(envs, env, {**conf, "restore": stopped["savepoint"]}, tmp_path / "restored.log")
    request.addfinalizer(restored.stop)
    assert restored.wait() == {"run": "success", "task": "success", "try_number": 1}, restored.tail()
    result = result_of(pipeline, 2)
    assert result is not None and result["status"] == "finished", result
    assert result["restored_from"] == stopped["savepoint"], result
    assert result["first_batch"] == 3 and result["last_batch"] == 5, result
    pipeline.assert_exact()  # the oracle from the input, no batch twice, no staged output left
