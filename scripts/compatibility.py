"""Write docs/compatibility.md, the support table (Spark line x feature), from the JUnit
results of `make test-matrix` (`.venvs/results/spark-<line>/*.xml`) and the feature table of
the runtime (`airflow_sparkpoint.runtime.spark_support.FEATURES`).

A matrix feature is "works" when every test of it passed on the line, "fails" (with the
failing tests) otherwise, "not run" without results. A gated feature is "refused" on a
line older than its minimum (the runtime refuses it before anything is written, naming
the feature and the minimum version), else "available" (or "works" when the matrix ran a
test of it). Usage: python scripts/compatibility.py RESULTS_DIR OUTPUT_MD
"""

from __future__ import annotations

import datetime
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from airflow_sparkpoint.runtime.spark_support import FEATURES, spark_line

# matrix feature -> the test modules (JUnit classnames start with them) that prove it
MATRIX = {
    "checkpoints, SIGKILL and restart (Delta merge)": ("tests.integration.test_kill_restart",),
    "SIGTERM and restart": ("tests.integration.test_driver_sigterm",),
    "savepoint relocation and restore": ("tests.integration.test_runtime_restore",),
    "Delta sink, append and merge": ("tests.integration.test_delta_sink.",),
    "Delta sink on S3": ("tests.integration.test_delta_sink_s3",),
    "S3 sink": ("tests.integration.test_s3_sink",),
    "self-healing replay": ("tests.races.test_self_healing",),
}
# gated feature -> the matrix tests of it (a test id contains this), marked spark_feature
GATED_TESTS = {"transformWithState": "transformWithState"}


def lines() -> list[tuple[str, str]]:
    rows = (REPO / "scripts" / "spark-lines.txt").read_text().splitlines()
    return [tuple(r.split()[:2]) for r in rows if r.strip() and not r.startswith("#")]  # type: ignore[misc]


def outcomes(results: Path) -> dict[str, list[tuple[str, str]]]:
    """classname.name -> outcome ('passed', 'failed', 'skipped: reason') of every test
    case in the JUnit files of `results` (one directory per line)."""
    found: dict[str, list[tuple[str, str]]] = {}
    cases = [case for xml in sorted(results.glob("*.xml")) for case in ET.parse(xml).iter("testcase")]
    for case in cases:
        name = f"{case.get('classname')}.{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = f"skipped: {child.get('message', '')}"
        found.setdefault(name, []).append((name, outcome))
    return found


def cell(results: dict[str, list[tuple[str, str]]] | None, prefixes: tuple[str, ...],
         contains: str = "") -> str:
    if results is None:
        return "not run"
    cases = [o for name, items in results.items() if name.startswith(prefixes) and contains in name
             for o in items]
    if not cases:
        return "not run"
    failed = [name.rsplit(".", 1)[-1] for name, o in cases if o == "failed"]
    passed = sum(o == "passed" for _, o in cases)
    skipped = sorted({o.removeprefix("skipped: ") for _, o in cases if o.startswith("skipped")})
    if failed:
        return (f"**fails** ({len(failed)} of {len(cases)}: "
                f"{', '.join(failed[:3])}{' …' if len(failed) > 3 else ''})")
    text = f"works ({passed} test{'' if passed == 1 else 's'})"
    return text + (f"; skipped: {'; '.join(skipped)}" if skipped else "")


def main(results_dir: Path, out: Path) -> None:
    versions = lines()
    results = {line: outcomes(results_dir / f"spark-{line}") if (results_dir / f"spark-{line}").is_dir()
               else None for line, _ in versions}
    head = ["feature", *[f"Spark {line} ({version})" for line, version in versions]]
    body = [[feature, *[cell(results[line], prefixes) for line, _ in versions]]
            for feature, prefixes in MATRIX.items()]
    for feature in FEATURES.values():
        row = [f"{feature.name} (needs {feature.needs})"]
        for line, version in versions:
            tested = (cell(results[line], ("tests.",), GATED_TESTS[feature.name])
                      if feature.name in GATED_TESTS else "not run")
            absent = (f"refused: needs Spark ≥ {feature.min_text}" if feature.refused_by_runtime
                      else f"not in PySpark < {feature.min_text}: the query cannot be built")
            row.append(absent if spark_line(version) < feature.min_version
                       else tested if tested != "not run" else "available")
        body.append(row)
    table = (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
             + ["| " + " | ".join(r) + " |" for r in body])
    ran = [line for line, _ in versions if results[line] is not None]
    out.write_text("\n".join([
        "# Compatibility: Spark lines × features",
        "",
        ("Generated by `scripts/compatibility.py` from the results of `make test-matrix` "
         f"({datetime.date.today().isoformat()}; lines with results: "
         f"{', '.join(ran) or 'none'}). Do not edit by "
         "hand: run `make test-matrix` (or `make test-matrix SPARK_LINES=3.5`) and commit the result."),
        "",
        ("Each line runs in its own environment holding only that line's `pyspark` and "
         "the runtime's libraries "
         "(no Airflow); the runtime comes from the source tree. \"works\": every test "
         "of the feature passed on "
         "the line. \"refused\": the runtime refuses the feature on that line before "
         "anything is written, with "
         "a message naming the feature and the minimum Spark version "
         "(`airflow_sparkpoint/runtime/spark_support.py`, `FEATURES`). \"not in "
         "PySpark\": the line's PySpark "
         "has no API for it, so a job using it fails while building its query, before anything is written. "
         "\"available\": the line has the API; "
         "the feature's own tests run in the default suite (Spark 4.2), not in the matrix."),
        "",
        *table,
        "",
    ]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
