"""The cumulative chaos record (issue #32): every crash trial ``make chaos`` runs is appended
as one JSON line to ``docs/chaos/trials.jsonl`` (``SPARKPOINT_CHAOS_RECORD``), and
``docs/chaos/README.md`` is the table made from all of them: per run (date, commit, seed,
trials, result) and per case x fault point x commit mode, with the duplicated and lost
rows. A trial whose fault did not fire counts as failed, as in the sweep itself.

    .venv/bin/python -m tests.chaos.record   # regenerate the table from the record
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.chaos.harness import TrialResult

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "chaos" / "trials.jsonl"
TABLE = ROOT / "docs" / "chaos" / "README.md"
ENV = "SPARKPOINT_CHAOS_RECORD"


def trial_line(run: str, title: str, seed: Any, result: TrialResult) -> dict[str, Any]:
    """One trial's record: what was planned, what fired, what the output showed."""
    trial = result.trial
    return {
        "run": run, "title": title, "seed": str(seed), "index": trial.index, "case": trial.case,
        "mode": trial.mode, "scenario": trial.scenario, "staging": trial.staging,
        "faults": [f"{f.point}:{f.batch}@{f.where}" for f in trial.faults],
        "fired": [f.fault.point for f in result.firings if f.fired],
        "duplicates": result.verdict.duplicates, "lost": result.verdict.lost,
        "ok": result.ok, "failures": result.failures()[:3], "seconds": round(result.seconds, 1),
    }


def run_id(now: datetime.datetime | None = None) -> str:
    """This run's name: UTC time and the commit it tested (``-dirty`` with local changes)."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{stamp} unknown"
    return f"{stamp} {commit}{'-dirty' if dirty else ''}"


def append(path: Path, reports: Iterable[tuple[str, Sequence[TrialResult], Any]], run: str) -> int:
    """Append every trial of `reports` to the record at `path`; the number appended."""
    lines = [trial_line(run, title, seed, r) for title, results, seed in reports for r in results]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for line in lines:
            out.write(json.dumps(line, sort_keys=True) + "\n")
    return len(lines)


def load(path: Path) -> list[dict[str, Any]]:
    """The record's trials, oldest first.

    Raises:
        ValueError: a line that is not JSON (names the line).
        TypeError: a line that is JSON but not an object (names the line).
    """
    trials = []
    for number, text in enumerate(path.read_text().splitlines(), 1) if path.exists() else ():
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON: {e}") from e
        if not isinstance(line, dict):
            raise TypeError(f"{path}:{number}: expected a JSON object per line, got {text[:80]!r}")
        trials.append(line)
    return trials


def render(trials: Sequence[dict[str, Any]]) -> str:
    """The Markdown page: totals, one row per run, one row per case x point x mode."""
    failed = [t for t in trials if not t["ok"]]
    out = [
        "# The chaos record",
        "",
        "Every crash trial of `make chaos` (and of the CI subset when run by it), appended by",
        "`tests/chaos/record.py` to [`trials.jsonl`](trials.jsonl); this page is generated from",
        "that file (`.venv/bin/python -m tests.chaos.record`). A trial SIGKILLs real `spark-submit`",
        "drivers (or the commit step, or a rollback) at its fault points, restarts as an Airflow",
        "retry would, and compares the sink with the input row by row; it counts only if every",
        "fault fired (once-marker, SIGKILL exit and the hook's line). See",
        "[development.md](../development.md), \"Fault injection\".",
        "",
        (f"**{len(trials)} trials, {sum(t['duplicates'] for t in trials)} duplicated rows, "
         f"{sum(t['lost'] for t in trials)} lost rows, {len(failed)} failed trials.**"),
        "",
        "## Runs",
        "",
        "| run (UTC, commit) | seed | what | trials | failed |",
        "|---|---|---|---:|---:|",
    ]
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        runs[(t["run"], t["seed"], t["title"])].append(t)
    for (run, seed, title), mine in runs.items():
        out.append(f"| {run} | {seed} | {title} | {len(mine)} | {sum(not t['ok'] for t in mine)} |")
    out += ["", "## By case, fault point and commit mode", "",
            "| case | point | mode | trials | fired | duplicates | lost | failed |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    cells: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    for t in trials:
        for point in dict.fromkeys(f.split(":")[0] for f in t["faults"]):
            cell = cells[(t["case"], point, t["mode"])]
            cell["trials"] += 1
            cell["fired"] += point in t["fired"]
            cell["duplicates"] += t["duplicates"]
            cell["lost"] += t["lost"]
            cell["failed"] += not t["ok"]
    for (case, point, mode), c in sorted(cells.items()):
        out.append(f"| {case} | {point} | {mode} | {c['trials']} | {c['fired']} | {c['duplicates']} | "
                   f"{c['lost']} | {c['failed']} |")
    if failed:
        out += ["", "## Failed trials", ""]
        out += [f"- {t['run']} seed {t['seed']} #{t['index']} {t['case']} {t['mode']} {t['faults']}: "
                f"{'; '.join(t['failures'])}" for t in failed]
    return "\n".join(out) + "\n"


def write_table(record: Path = RECORD) -> Path:
    """Regenerate the table beside `record` (its ``README.md``); its path."""
    table = record.parent / TABLE.name
    table.write_text(render(load(record)))
    return table


if __name__ == "__main__":
    write_table()
    print(f"wrote {TABLE.relative_to(ROOT)} from {len(load(RECORD))} trials")
