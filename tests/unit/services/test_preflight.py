"""The blue-green pre-flight's use case without Airflow or Spark (`services/preflight.py`):
which of blue's checkpoints it drills, and the three ways it refuses. The drill is a plain
callable here; the operator's is spark-submit (tests/integration/test_preflight.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.services.drill import DrillFailed
from airflow_sparkpoint.services.preflight import MAX_RETIRED, before, newest, run_preflight, still_there
from airflow_sparkpoint.storage import open_storage
from tests.support.records import put_checkpoint


def blue(root: Path, checkpoints: int) -> Catalog:
    catalog = Catalog(open_storage(str(root)), "totals")
    catalog.claim_generation()
    for batch in range(checkpoints):
        put_checkpoint(catalog, {f"state/0/0/{batch + 1}.delta": f"state {batch}".encode()}, batch_id=batch)
    return catalog


class Drills:
    """Answers each drill with the next outcome: a batch count, or a `DrillFailed` text."""

    def __init__(self, *outcomes: int | str) -> None:
        self.outcomes = list(outcomes)
        self.drilled: list[int] = []

    def __call__(self, handle: SnapshotHandle) -> tuple[dict[str, Any], dict[str, Any]]:
        self.drilled.append(handle.metadata.batch_id)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, str):
            raise DrillFailed(outcome)
        return {"snapshot_batch": handle.metadata.batch_id}, {"batches_processed": outcome}


def test_a_drill_that_ran_a_batch_passes_on_the_newest_checkpoint(tmp_path: Path) -> None:
    catalog = blue(tmp_path, 3)
    drills = Drills(1)
    passed = run_preflight(catalog, green="green.py", drill=drills, storage_options={})
    assert drills.drilled == [2]
    assert passed.summary("totals-preflight") == {
        "ok": True, "snapshot": passed.handle.uri, "batch_id": 2, "drill_job": "totals-preflight",
        "result": {"batches_processed": 1},
        "tried": [{"snapshot": passed.handle.uri, "outcome": "restored", "snapshot_batch": 2}]}


def test_no_batch_drills_the_checkpoint_before_and_with_none_left_is_inconclusive(tmp_path: Path) -> None:
    catalog = blue(tmp_path, 3)
    drills = Drills(0, 0, 0)
    with pytest.raises(DrillFailed, match="pre-flight inconclusive: green restored job 'totals'.s checkpoint "
                                          ".*chk-1 but ran no batch"):
        run_preflight(catalog, green="green.py", drill=drills, storage_options={})
    assert drills.drilled == [2, 1, 0]
    newest_handle = newest(catalog)
    older = before(catalog, newest_handle)
    assert older is not None and older.metadata.batch_id == 1
    assert before(catalog, catalog.handle(catalog.list_checkpoints()[-1].metadata)) is None


def test_a_failed_drill_on_a_stored_checkpoint_is_refused_with_its_error(tmp_path: Path) -> None:
    catalog = blue(tmp_path, 2)
    with pytest.raises(DrillFailed,
                       match=r"pre-flight refused: green \(green.py\) cannot restore job 'totals'.s "
                             r"checkpoint .*chk-2 \(batch 1\); blue was left running. schema") as refused:
        run_preflight(catalog, green="green.py", drill=Drills("schema mismatch"), storage_options={})
    assert isinstance(refused.value.__cause__, DrillFailed)


def test_a_retired_checkpoint_is_drilled_again_at_most_max_retired_times(tmp_path: Path) -> None:
    catalog = blue(tmp_path, MAX_RETIRED + 3)
    drilled: list[int] = []

    def retired_under_the_drill(handle: SnapshotHandle) -> tuple[dict[str, Any], dict[str, Any]]:
        drilled.append(handle.metadata.batch_id)
        shutil.rmtree(handle.uri.removeprefix("file://"))  # blue's retention removes it meanwhile
        assert not still_there(handle, {})
        raise DrillFailed("file not found")

    with pytest.raises(DrillFailed, match=r"pre-flight refused: .*\(batch 2\); blue was left running"):
        run_preflight(catalog, green="green.py", drill=retired_under_the_drill, storage_options={})
    assert drilled == [5, 4, 3, 2], \
        "each retired checkpoint is followed by blue's new newest, MAX_RETIRED times"


def test_a_blue_without_a_completed_checkpoint_is_refused_before_any_drill(tmp_path: Path) -> None:
    catalog = blue(tmp_path, 0)
    drills = Drills()
    with pytest.raises(DrillFailed, match="pre-flight: job 'totals' has no completed checkpoint under"):
        run_preflight(catalog, green="green.py", drill=drills, storage_options={})
    assert drills.drilled == []
