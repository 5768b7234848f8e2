"""Check what `make dist` is about to build, and what it built.

Before the build (no argument): the version has its CHANGELOG.md section. The version
has one home, ``airflow_sparkpoint.__version__`` (pyproject.toml reads it, the provider
info reports it); ``X.Y.Z`` needs a ``## X.Y.Z`` section, a development version
(``X.Y.Z.devN``) the ``## Unreleased`` one.

After it (the built files as arguments): one wheel and one sdist of that version, the
wheel with the provider's and the plugin's entry points, ``py.typed`` and no tests or
DAGs, the sdist with the CHANGELOG and the LICENSE.

Exit 0 when all holds; else 1, printing each problem.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def version() -> str:
    text = (REPO / "airflow_sparkpoint" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if not match:
        raise SystemExit("airflow_sparkpoint/__init__.py has no __version__ = \"...\" line")
    return match.group(1)


def changelog_problems(current: str) -> list[str]:
    sections = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    wanted = "Unreleased" if re.search(r"\.dev\d+$", current) else current
    if wanted not in sections:
        return [(f"CHANGELOG.md has no '## {wanted}' section for version {current} "
                f"(sections: {', '.join(sections)})")]
    return []


def dist_problems(current: str, files: list[Path]) -> list[str]:
    problems = []
    wheels = [f for f in files if f.name.endswith(".whl")]
    sdists = [f for f in files if f.name.endswith(".tar.gz")]
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"expected one wheel and one sdist, got {[f.name for f in files]}"]
    if not wheels[0].name.startswith(f"airflow_sparkpoint-{current}-"):
        problems.append(f"{wheels[0].name} is not version {current}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        entry_points = next((wheel.read(n).decode() for n in names
                             if n.endswith(".dist-info/entry_points.txt")), "")
    for needed in ("airflow_sparkpoint/py.typed", "airflow_sparkpoint/runtime/job.py",
                   "airflow_sparkpoint/plugins/app.py"):
        if needed not in names:
            problems.append(f"{wheels[0].name} lacks {needed}")
    for group in ("[apache_airflow_provider]", "[airflow.plugins]", "[console_scripts]"):
        if group not in entry_points:
            problems.append(f"{wheels[0].name} declares no {group} entry point")
    stray = [n for n in names if n.startswith(("tests/", "dags/", "docs/", "benchmarks/"))]
    if stray:
        problems.append(f"{wheels[0].name} carries {stray[:3]}")
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for needed in ("CHANGELOG.md", "LICENSE", "README.md", "pyproject.toml"):
        if needed not in members:
            problems.append(f"{sdists[0].name} lacks {needed}")
    return problems


def main(argv: list[str]) -> int:
    current = version()
    problems = changelog_problems(current)
    if argv:
        problems += dist_problems(current, [Path(a) for a in argv])
    for problem in problems:
        print(f"check_release: {problem}", file=sys.stderr)
    if not problems:
        print(f"airflow-sparkpoint {current}: "
              + ("built files check out" if argv else "CHANGELOG section found"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
