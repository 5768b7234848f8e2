"""The built wheel, installed as docs/install.md says, into environments it has never seen
(issue #48): `make test-install`, which .ci/run calls after `make test` (not part of it:
minutes of environment building; see docs/development.md).

* **The Airflow side**: a fresh virtual environment with Airflow and the wheel, resolved
  with a constraints file, as a user installs a provider. Airflow's own constraints file
  is at ``raw.githubusercontent.com``, which this machine cannot reach: unless
  ``SPARKPOINT_INSTALL_CONSTRAINTS`` names it (a path or URL), the development
  environment's pins (``uv pip freeze`` of ``.venv``, without this package and without
  ``pyspark``) play its part. It gets no ``pyspark``: the Spark provider's
  ``pyspark-client`` (the Spark Connect client, which can run no driver) is what a user
  gets, and no ``spark-submit``.
* **The Spark side**: ``.venvs/spark-<line>`` (`scripts/spark-env.sh`: that line's
  ``pyspark`` and the runtime's libraries, the environment `make test-matrix` uses), plus
  the wheel installed ``--no-deps`` as install.md's first way says, into a thin virtual
  environment that sees the Spark environment's packages (a ``.pth`` file), so the shared
  one is left as it was.

Checked: the wheel carries its version and no ``pyspark``; ``airflow providers list``
and ``airflow plugins`` show the provider and its UI plugin; the example DAGs of
``dags/`` parse without import errors; and docs/tutorial.md, run as written (the script
`tests/docs/test_tutorial.py` runs) with the Airflow environment's commands, reaches its
first checkpoint through ``spark-submit`` of the Spark environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs_blocks import tutorial_script
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.airflow, pytest.mark.timeout(3600)]

UV = str(Path(sys.executable).parent / "uv")
#: the Spark line of the Spark side: the newest maintained one (CI builds it for its matrix check)
LINE = os.environ.get("INSTALL_SPARK_LINE") or [
    row.split()[0] for row in (REPO / "scripts" / "spark-lines.txt").read_text().splitlines()
    if row.strip() and not row.startswith("#")][-1]
EXAMPLE_DAGS = {"example_sparkpoint_quickstart", "example_sparkpoint_incremental_etl",
                "example_sparkpoint_blue_green", "example_sparkpoint_write_audit_publish",
                "example_sparkpoint_scheduled_savepoints", "example_sparkpoint_restore_drill",
                "example_sparkpoint_health"}


def run(command: list[str], env: Mapping[str, str], *, cwd: Path = REPO, timeout: float = 1800) -> str:
    """`command`'s stdout; its exit code must be 0."""
    done = subprocess.run(command, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, \
        f"{command} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def json_output(text: str) -> object:
    """The JSON document a command printed after its log lines (Airflow's CLI logs warnings
    to stdout, e.g. a missing graphviz)."""
    start = next((i for i, line in enumerate(text.splitlines()) if line.startswith(("[", "{"))), None)
    assert start is not None, f"no JSON in:\n{text[-3000:]}"
    return json.loads("\n".join(text.splitlines()[start:]))


def clean_environment(home: Path) -> dict[str, str]:
    """This process's environment without what points into the development venv, the
    source tree or its Spark (a user's shell)."""
    drop = ("AIRFLOW", "_AIRFLOW", "PYSPARK_", "SPARKPOINT_", "SPARK_", "VIRTUAL_ENV", "PYTHON", "JAVA_TOOL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep)
                                  if not (Path(p) / "spark-submit").exists()
                                  and Path(p) != Path(sys.executable).parent)
    env["HOME"] = str(home)
    return env


def constraints(path: Path) -> str:
    """Airflow's constraints file when given, else the development environment's pins."""
    given = os.environ.get("SPARKPOINT_INSTALL_CONSTRAINTS")
    if given:
        return given
    frozen = run([UV, "pip", "freeze", "--python", sys.executable], os.environ)
    pins = [line for line in frozen.splitlines() if "==" in line
            and re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower() not in ("airflow-sparkpoint", "pyspark")]
    path.write_text("\n".join(pins) + "\n")
    return str(path)


@dataclass
class Installed:
    wheel: Path
    version: str
    airflow: Path  # the Airflow side's venv
    spark_home: Path  # the Spark side's pyspark (a Spark distribution)
    spark_python: Path  # the Spark side's interpreter, with the wheel's runtime
    env: dict[str, str]  # a worker's environment: the Airflow venv first on PATH, Spark's bin after it

    def airflow_cmd(self, *args: str) -> list[str]:
        return [str(self.airflow / "bin" / "airflow"), *args]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    env = clean_environment(base)
    # the wheel, built as `make dist` builds it
    run([UV, "build", "--wheel", "--quiet", "--out-dir", str(base / "dist")], env)
    (wheel,) = (base / "dist").glob("airflow_sparkpoint-*.whl")
    version = wheel.name.split("-")[1]
    # the Airflow side: a fresh venv, Airflow and the wheel under the constraints
    airflow = base / "airflow-venv"
    run([UV, "venv", "--quiet", "--python", sys.executable, str(airflow)], env)
    pin = next(line for line in run([UV, "pip", "freeze", "--python", sys.executable], env).splitlines()
               if line.startswith("apache-airflow=="))
    run([UV, "pip", "install", "--quiet", "--python", str(airflow / "bin" / "python"), pin, str(wheel),
         "--constraint", constraints(base / "constraints.txt")], env)
    # the Spark side: the line's environment (scripts/spark-env.sh), the wheel's runtime beside it
    run(["make", "spark-envs", f"SPARK_LINES={LINE}", f"UV={UV}"], env)
    spark_env = REPO / ".venvs" / f"spark-{LINE}"
    side = base / "spark-side"
    run([UV, "venv", "--quiet", "--python", str(spark_env / "bin" / "python"), str(side)], env)
    purelib = sysconfig.get_path("purelib", vars={"base": str(side), "platbase": str(side)})
    spark_purelib = run([str(spark_env / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        env).strip()
    Path(purelib, "spark-env.pth").write_text(spark_purelib + "\n")
    run([UV, "pip", "install", "--quiet", "--no-deps", "--python", str(side / "bin" / "python"), str(wheel)],
        env)
    spark_home = Path(run([str(side / "bin" / "python"), "-c",
                           "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                          env).strip())
    worker = {**env,
              "PATH": os.pathsep.join([str(airflow / "bin"), env["PATH"], str(spark_home / "bin")]),
              "SPARK_HOME": str(spark_home),
              # the driver and Spark's Python workers: the Spark side's (install.md, "The Spark side")
              "PYSPARK_PYTHON": str(side / "bin" / "python")}
    return Installed(wheel, version, airflow, spark_home, side / "bin" / "python", worker)


def test_the_wheel_installs_into_airflow_without_pyspark(installed: Installed) -> None:
    python = str(installed.airflow / "bin" / "python")
    probe = ("import importlib.metadata as m, os, airflow, airflow_sparkpoint as s\n"
             "from airflow_sparkpoint.services.spark_env import local_spark_home\n"
             "print(s.__version__, m.version('airflow-sparkpoint'), airflow.__version__, "
             "local_spark_home())\nprint(os.path.dirname(s.__file__))")
    first, where = run([python, "-c", probe], installed.env, cwd=installed.airflow).splitlines()
    version, distribution, _airflow, spark_home = first.split()
    assert version == distribution == installed.version
    assert spark_home == "None", "the Airflow side must have no Spark distribution"
    assert where.startswith(str(installed.airflow)), f"imported from {where}, not the installed wheel"
    shown = subprocess.run([UV, "pip", "show", "--python", python, "pyspark"], env=installed.env,
                           capture_output=True, text=True, check=False)
    assert shown.returncode != 0, f"pyspark is installed:\n{shown.stdout}"


def test_airflow_sees_the_provider_and_its_ui_plugin(installed: Installed, tmp_path: Path) -> None:
    env = {**installed.env, "AIRFLOW_HOME": str(tmp_path)}
    providers = json_output(run(installed.airflow_cmd("providers", "list", "-o", "json"), env, cwd=tmp_path))
    assert isinstance(providers, list)
    ours = [p for p in providers if p["package_name"] == "airflow-sparkpoint"]
    assert ours and ours[0]["version"] == installed.version, providers
    plugins = run(installed.airflow_cmd("plugins", "-o", "json"), env, cwd=tmp_path)
    assert "sparkpoint" in plugins, plugins


def test_the_example_dags_import(installed: Installed, tmp_path: Path) -> None:
    env = {**installed.env, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    run(installed.airflow_cmd("db", "migrate"), env, cwd=tmp_path)
    errors = json_output(run(installed.airflow_cmd("dags", "list-import-errors", "-l", "-o", "json"), env,
                             cwd=tmp_path))
    assert errors == [], errors
    listed = json_output(run(installed.airflow_cmd("dags", "list", "-l", "-o", "json"), env, cwd=tmp_path))
    assert isinstance(listed, list)
    dags = {d["dag_id"] for d in listed}
    assert EXAMPLE_DAGS <= dags, dags


def test_the_tutorial_runs_against_the_spark_environment(installed: Installed, tmp_path: Path) -> None:
    script = tmp_path / "tutorial.sh"
    script.write_text(tutorial_script((REPO / "docs" / "tutorial.md").read_text()))
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**installed.env, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["job"], status["generation"], status["state"]) == ("orders", 1, "finished"), status
    first = status["latest_checkpoint"]
    assert first is not None and first["batch_id"] == 1, status  # two input files: batches 0 and 1
    # read back in the Airflow environment: the Spark that took the checkpoint, and the totals
    # from the input the tutorial writes (ana 5 + 3, bo 7), through the hook
    read = ("import json, sys\n"
            "from airflow_sparkpoint.checkpoints import Catalog\n"
            "from airflow_sparkpoint.hooks import SparkpointHook\n"
            "latest = Catalog.open(sys.argv[1], 'orders').latest()\n"
            "rows = SparkpointHook(None, storage_uri=sys.argv[1]).delta_rows(sys.argv[2])\n"
            "print(json.dumps({'spark': latest.spark, 'totals': {r['user']: r['total'] for r in rows}}))")
    seen = json.loads(run([str(installed.airflow / "bin" / "python"), "-c", read,
                           str(tmp_path / "checkpoints"),
                           str(tmp_path / "data" / "totals")], installed.env, cwd=tmp_path))
    assert str(seen["spark"].get("version", "")).startswith(f"{LINE}."), seen
    assert seen["totals"] == {"ana": 8, "bo": 7}, seen
