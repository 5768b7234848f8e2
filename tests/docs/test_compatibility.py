"""The one compatibility table (docs/install.md "Compatibility", which the README links,
issue #48) says what the package declares: each row's supported range is the specifier
of pyproject.toml, the Spark row lists the maintained lines of scripts/spark-lines.txt,
and no other page carries a second table of its own."""

from __future__ import annotations

import re

from tests.support.paths import REPO


def table() -> dict[str, str]:
    """The rows of install.md's Compatibility section: the component's cell -> its
    "supported" cell."""
    text = (REPO / "docs" / "install.md").read_text()
    section = text.split("\n## Compatibility\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:]}


def requirement(requirements: list[str], name: str) -> str:
    """The version specifier of `name` in `requirements` (e.g. ``>=3.2,<4``)."""
    (found,) = [r for r in requirements if re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] == name]
    return found[len(name):].strip()


def test_the_supported_ranges_are_pyprojects() -> None:
    import tomllib  # Python >= 3.11, as the development environment

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    rows = table()
    supported = {
        "Apache Airflow": requirement(project["dependencies"], "apache-airflow"),
        "Spark provider": requirement(project["dependencies"], "apache-airflow-providers-apache-spark"),
        "Spark (the cluster's, and the driver's `pyspark`)":
            requirement(project["optional-dependencies"]["spark"], "pyspark"),
        "Python": project["requires-python"],
    }
    for component, specifier in supported.items():
        assert (f"`{specifier}`" in rows[component]
                or f"≥ {specifier.removeprefix('>=')}" in rows[component]), (
            f"install.md's {component!r} row says {rows[component]!r}; pyproject.toml declares {specifier!r}")
    for library in project["optional-dependencies"]["runtime"]:
        assert f"`{library}`" in rows["runtime libraries"], (library, rows["runtime libraries"])


def test_the_spark_row_lists_every_maintained_line() -> None:
    lines = [row.split()[0] for row in (REPO / "scripts" / "spark-lines.txt").read_text().splitlines()
             if row.strip() and not row.startswith("#")]
    spark_row = table()["Spark (the cluster's, and the driver's `pyspark`)"]
    listed = re.findall(r"\b\d\.\d\b", spark_row.split("(")[0])
    assert listed == lines, f"install.md lists Spark {listed}; scripts/spark-lines.txt maintains {lines}"


def test_no_other_page_has_a_compatibility_table_of_its_own() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        if page.name in ("install.md", "compatibility.md"):  # the table, and the matrix's per-line results
            continue
        # the table's rows of versions (clusters.md's table per cluster manager is another one)
        rows = [line for line in page.read_text().splitlines()
                if re.match(r"\|\s*(Apache Airflow|Airflow|Spark provider)\s*\|", line)]
        assert not rows, f"{page.relative_to(REPO)} has a table of supported versions: {rows}"
