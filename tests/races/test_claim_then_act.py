"""Claim, then act (invariant 8), with two real drivers of one job.

* **after planning, before the claim** (issue #15 hole 3): driver A plans its restart
  from the store as it is, and is held before it claims its generation; driver B runs
  meanwhile and commits a batch built from every file available; more input arrives; A
  goes on. A must plan again after its claim and continue after B's checkpoint. Acting on
  its stale plan, A would rebuild batch 0 from all files, the Delta commit of batch 0
  would be skipped as already done, and the new file's rows would be lost.
* **inside recovery** (issue #15 item 6): driver A is held inside restore-time recovery;
  driver B (a newer generation, ``commit.mode=external``) stages and records its batches
  and ends. A goes on: it must stop (`StaleGeneration`) without aborting anything; a
  stale recovery would abort B's records and staged files, and the commit step would
  then have nothing to publish.

Every check is row by row against the input files, and each test first proves that its
driver really was held at the pause point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.services.commit import commit_pending
from tests.support.race_drivers import JOB, args, diff, expected_rows, job_conf, table_rows, write_inputs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]


def test_a_plan_made_before_the_claim_is_made_again_after_it(tmp_path: Path, start_driver: Any) -> None:
    root, inputs, table = tmp_path / "checkpoints", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=2)
    catalog = Catalog.open(str(root), JOB)
    stale = start_driver("A", job_conf(root), args(tmp_path, max_files=0), pause="after_plan")
    held = stale.reached("after_plan")
    assert held["batch"] is None, "A planned from empty state (nothing was checkpointed yet)"
    assert catalog.current_generation() == 0, "A is held before its claim"

    fresh = start_driver("B", job_conf(root), args(tmp_path, max_files=0))
    assert fresh.wait() == 0, fresh.tail()
    assert fresh.result is not None and fresh.result["last_batch"] == 0
    write_inputs(inputs, files=1, start=2)  # arrives before A goes on
    stale.release("after_plan")
    assert stale.wait() == 0, stale.tail()

    result = stale.result
    assert result is not None and result["generation"] == 2
    assert result["restored_from"] == catalog.checkpoint_uri(fresh.result["last_checkpoint_id"]), \
        "A must restore what B checkpointed after its claim, not its stale plan (empty state)"
    assert result["first_batch"] == 1
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, problems


@pytest.mark.slow  # ~1.5 min; the fence itself is unit-tested (tests/unit/runtime/test_fencing.py)
def test_a_superseded_generation_stops_inside_recovery_without_aborting(
    tmp_path: Path, start_driver: Any
) -> None:
    root, inputs, table = tmp_path / "checkpoints", tmp_path / "input", tmp_path / "table"
    write_inputs(inputs, files=2)
    catalog = Catalog.open(str(root), JOB)
    external = job_conf(root, {"commit.mode": "external"})
    zombie = start_driver("A", external, args(tmp_path), pause="recovery")
    assert zombie.reached("recovery")["generation"] == 1

    newer = start_driver("B", external, args(tmp_path))
    assert newer.wait() == 0, newer.tail()
    assert newer.result is not None and newer.result["generation"] == 2 and newer.result["last_batch"] == 1
    staged = {(r.batch_id, r.generation) for r in catalog.transactions()}
    assert staged == {(0, 2), (1, 2)}, "B left its batches for the commit step"

    zombie.release("recovery")
    assert zombie.wait() != 0, "the superseded generation must stop"
    assert "StaleGeneration" in zombie.output and "superseded by generation 2" in zombie.output, zombie.tail()
    assert {(r.batch_id, r.generation) for r in catalog.transactions()} == staged, "A touched B's records"

    outcome = commit_pending(catalog)
    assert sorted(outcome["committed"]) == sorted(f"{JOB}-b{b}-g2" for b in (0, 1)), outcome
    problems = diff(expected_rows(inputs), table_rows(table))
    assert not problems, problems
    assert catalog.transactions() == []
