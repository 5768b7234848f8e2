"""The cumulative chaos record (`tests.chaos.record`): trials appended as JSON lines and
the table made from them count what the trials showed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.harness import Fault, Firing, Trial, TrialResult, Verdict
from tests.chaos.record import append, load, render, write_table


def result(index: int, case: str, point: str, *, fired: bool = True, lost: int = 0) -> TrialResult:
    fault = Fault(point, 1)
    return TrialResult(Trial(index, case, "checkpoint", "crash", (fault,)),
                       [Firing(fault, "job.log", marker=fired, sigkill=True, line=True)], Verdict(lost=lost))


def test_appended_trials_add_up_in_the_table_and_a_failure_is_named(tmp_path: Path) -> None:
    path = tmp_path / "chaos" / "trials.jsonl"
    append(path,
           [("sweep", [result(0, "delta-merge", "stage"), result(1, "delta-merge", "stage", lost=2)], 7)],
           "2026-11-26T00:00:00Z abc")
    append(path, [("sweep", [result(0, "s3@moto", "copy", fired=False)], 8)], "2026-11-27T00:00:00Z def")

    trials = load(path)
    assert [(t["case"], t["ok"]) for t in trials] == [("delta-merge", True), ("delta-merge", False),
                                                      ("s3@moto", False)]
    page = render(trials)
    assert "**3 trials, 0 duplicated rows, 2 lost rows, 2 failed trials.**" in page
    assert "| delta-merge | stage | checkpoint | 2 | 2 | 0 | 2 | 1 |" in page
    assert "| s3@moto | copy | checkpoint | 1 | 0 | 0 | 0 | 1 |" in page  # unfired: failed
    assert "| 2026-11-27T00:00:00Z def | 8 | sweep | 1 | 1 |" in page
    assert "s3@moto checkpoint ['copy:1@job']: fault copy:1 did NOT fire" in page
    assert write_table(path).read_text() == page


def test_a_line_that_is_not_an_object_is_refused_by_number(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    path.write_text(json.dumps({"ok": True}) + "\n[1]\n")
    with pytest.raises(TypeError, match=r"trials\.jsonl:2: expected a JSON object"):
        load(path)
