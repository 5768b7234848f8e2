"""pyproject.toml's bounds match what the code imports (issue #19).

* Airflow: the package imports ``airflow.sdk.conf``, ``airflow.sdk.exceptions``'
  ``AirflowSkipException`` / ``AirflowSensorTimeout`` / ``AirflowFailException`` and
  ``airflow.sdk.observability``, which Task SDK 1.2 (Airflow 3.2) brought; Airflow 3.1's
  Task SDK 1.1 has none of them (checked in the published wheels). So 3.1 is refused.
* The Spark provider: the submit operator uses private names of it; every one exists on
  the installed provider, and the bound stops before the next major, which may move them.
* The environment the suite runs in satisfies every bound, the Spark side's (the
  ``runtime`` extra, pyspark's supported range in the ``spark`` extra) included.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.paths import REPO

pytestmark = pytest.mark.airflow



@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:  # Airflow configured before anything of it is imported
    return None


def requirements() -> dict[str, Requirement]:
    """The core dependencies and the ``amazon``, ``runtime`` and ``spark`` extras of
    pyproject.toml, by name."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    found = [Requirement(text) for text in [*project["dependencies"], *extras["amazon"], *extras["runtime"],
                                            *extras["spark"]]]
    return {req.name: req for req in found}


def test_the_installed_environment_satisfies_every_bound() -> None:
    for name, req in requirements().items():
        installed = importlib.metadata.version(name)
        assert req.specifier.contains(installed, prereleases=True), \
            f"{name} {installed} is outside {req.specifier}"


def test_airflow_31_is_refused_it_lacks_the_task_sdk_names_the_package_imports() -> None:
    spec = requirements()["apache-airflow"].specifier
    assert not spec.contains("3.1.8"), \
        f"apache-airflow{spec} admits 3.1, whose Task SDK lacks airflow.sdk.conf"
    assert spec.contains("3.2.0") and not spec.contains("4.0.0")
    import airflow.sdk.exceptions as sdk_exceptions
    from airflow.sdk import conf  # noqa: F401 - the names the package imports exist here

    for name in ("AirflowException", "AirflowSkipException", "AirflowSensorTimeout", "AirflowFailException"):
        assert hasattr(sdk_exceptions, name), name
    package = REPO / "airflow_sparkpoint"
    used = {m.group(1) for path in package.rglob("*.py")
            for m in re.finditer(r"from airflow\.sdk import ([\w, ]+)", path.read_text(encoding="utf-8"))}
    assert any("conf" in names.split(", ") for names in used), "the bound's reason is gone: revisit it"


def test_the_spark_providers_private_names_exist_and_the_next_major_is_excluded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_sparkpoint.operators.submit_hook import SPARK_CONNECTION_KEYS, SPARK_PROVIDER_PRIVATE_NAMES

    spec = requirements()["apache-airflow-providers-apache-spark"].specifier
    installed = Version(importlib.metadata.version("apache-airflow-providers-apache-spark"))
    assert not spec.contains(f"{installed.major + 1}.0.0"), (
        f"apache-airflow-providers-apache-spark{spec} admits the next major, which may move the private names"
    )
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_PROBE", '{"conn_type": "spark", "host": "local[2]"}')
    operator = SparkSubmitOperator(task_id="probe", application="/app.py", conn_id="spark_probe")
    hook = SparkSubmitHook(conn_id="spark_probe")
    for cls, name in SPARK_PROVIDER_PRIVATE_NAMES:
        instance = operator if cls is SparkSubmitOperator else hook
        assert hasattr(instance, name), f"{cls.__name__}.{name} is gone from the Spark provider {installed}"
    assert set(SPARK_CONNECTION_KEYS) <= set(hook._connection), hook._connection
