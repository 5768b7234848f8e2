"""The reference pages say what the code does: every parameter of every operator and of
the sensor is in its table with the code's default, and every ``spark.sparkpoint.*`` key
is in the configuration table."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"
_EMPTY = inspect.Parameter.empty


def _tables(page: str) -> dict[str, list[dict[str, str]]]:
    """The ``| parameter | default | meaning |`` tables of `page`, by the ``## `Name` ``
    section they are in."""
    out: dict[str, list[dict[str, str]]] = {}
    section = ""
    for line in page.splitlines():
        heading = re.match(r"^##\s+`([^`]+)`", line)
        if heading:
            section = heading.group(1)
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                out.setdefault(section, []).append({"name": name, "default": cells[1]})
    return out


def _documented_default(cell: str) -> str | None:
    """The literal default a cell states (``None`` when it says it in words)."""
    match = re.match(r"^`([^`]*)`", cell)
    return match.group(1).strip("\"'") if match else None


def _same(code: Any, documented: str) -> bool:
    if isinstance(code, float) and code.is_integer():
        return documented in (str(code), str(int(code)))
    return documented == str(code)


def _own_parameters(cls: type) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


# Class names, imported in the test: importing the operators at collection would import
# Airflow before the session's airflow_home fixture sets AIRFLOW_HOME, and every later
# dag.test() in the same run would use another metadata database.
_CLASSES = [("operators.md", "operators", name) for name in (
    "SparkpointSubmitOperator", "SparkpointSavepointOperator", "SparkpointCommitOperator",
    "SparkpointHealthCheckOperator", "SparkpointDrillOperator", "SparkpointPreflightOperator")] + [
    ("sensor.md", "sensors", "SparkpointCheckpointSensor")]


@pytest.mark.parametrize("page,module,class_name", _CLASSES, ids=[c[2] for c in _CLASSES])
def test_every_parameter_is_documented_with_its_default(page: str, module: str, class_name: str,
                                                        airflow_home: Path) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"airflow_sparkpoint.{module}"), class_name)
    rows = {r["name"]: r["default"] for r in _tables((DOCS / page).read_text()).get(cls.__name__, [])}
    problems = []
    for name, default in _own_parameters(cls).items():
        if name not in rows:
            problems.append(f"{name}: not in the table")
            continue
        documented = _documented_default(rows[name])
        if default is _EMPTY:
            if rows[name] != "required":
                problems.append(f"{name}: required in the code, the table says {rows[name]!r}")
        elif documented is not None and not _same(default, documented):
            problems.append(f"{name}: default {default!r} in the code, the table says {rows[name]!r}")
    assert not problems, f"{cls.__name__} in docs/reference/{page}:\n" + "\n".join(problems)


def test_every_configuration_key_is_documented() -> None:
    from airflow_sparkpoint.runtime.config import KEYS, PREFIX

    page = (DOCS / "config.md").read_text()
    documented = set()
    for first_cell in re.findall(r"^\| (`spark\.sparkpoint\.[^|]*)\|", page, flags=re.MULTILINE):
        names = re.findall(r"`([^`]+)`", first_cell)
        base = names[0]
        documented.add(base)
        for suffix in names[1:]:  # `spark.sparkpoint.s3.endpoint` / `.region`
            documented.add(base.rsplit(".", 1)[0] + suffix)
    assert {PREFIX + k for k in KEYS} == documented


def test_every_exception_class_is_in_the_error_catalog_and_the_tree() -> None:
    """Each public exception class of `airflow_sparkpoint.exceptions` has a row of the
    error catalog (docs/operations.md) and a line of the tree (reference/exceptions.md)."""
    import airflow_sparkpoint.exceptions as module

    classes = sorted(name for name, obj in vars(module).items()
                     if isinstance(obj, type) and issubclass(obj, BaseException)
                     and obj.__module__ == module.__name__ and not name.startswith("_"))
    assert "JobAlreadyRunning" in classes  # the scan found the module's classes
    operations = (DOCS.parent / "operations.md").read_text()
    catalog = operations[operations.index("## Error catalog"):]
    rows = {m for cell in re.findall(r"^\| (`[^|]*)\|", catalog, flags=re.MULTILINE)
            for m in re.findall(r"`([A-Za-z]+)`", cell)}
    tree = (DOCS / "exceptions.md").read_text()
    problems = [f"{name}: no row of the error catalog (docs/operations.md)" for name in classes
                if name not in rows]
    problems += [f"{name}: not in the tree (docs/reference/exceptions.md)" for name in classes
                 if not re.search(rf"^[│├└─ ]*{name}\b", tree, flags=re.MULTILINE)]
    assert not problems, "\n".join(problems)
