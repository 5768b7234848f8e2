"""The restore drill's use case without Airflow or Spark (`services/drill.py`): the
output arguments it replaces, its scratch directory, and the newest savepoint it
drills; a drill that cannot find one fails naming the job."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.drill import DrillFailed, Scratch, drill_arguments, newest_savepoint
from airflow_sparkpoint.storage import MemoryStorage


def test_every_output_argument_points_at_the_scratch_directory_and_nothing_else_changes() -> None:
    args = ["--input", "/in", "--output", "/prod/out", "--report=/prod/r", "--limit", "9"]
    assert drill_arguments(args, {"output": "{scratch}/out", "--report": "{scratch}/r"}, "/d/drill-1") == [
        "--input", "/in", "--output", "/d/drill-1/out", "--report=/d/drill-1/r", "--limit", "9"]
    with pytest.raises(ConfigError, match="'--out', which is not among application_args"):
        drill_arguments(args, {"--out": "{scratch}/x"}, "/d/drill-1")
    with pytest.raises(ConfigError, match="'--limit' has no value to replace"):
        drill_arguments(["--limit"], {"--limit": "1"}, "/d/drill-1")


def test_a_scratch_directory_is_fresh_local_and_removed_whole(tmp_path: Path) -> None:
    first, second = (Scratch.create(str(tmp_path / "drills"), None),
                     Scratch.create(str(tmp_path / "drills"), None))
    assert first.root != second.root and Path(first.root).is_dir()
    assert first.work == f"{first.root}/live" and first.base is None  # no work_dir: its own directory
    shared = Scratch.create(str(tmp_path / "drills"), str(tmp_path / "executors"))
    assert shared.work == f"{tmp_path / 'executors'}/sparkpoint-drills/{shared.root.rsplit('/', 1)[1]}"
    (Path(first.root) / "out").mkdir()
    first.remove(storage_options={}, work_dir=None)
    assert not Path(first.root).exists() and Path(second.root).is_dir()
    temporary = Scratch.create(None, None)  # no drill_dir: a temporary base, removed with it
    assert temporary.base is not None and temporary.root.startswith(temporary.base)
    base = temporary.base
    temporary.remove(storage_options={}, work_dir=None)
    assert not Path(base).exists() and temporary.base is None


def test_no_savepoint_to_drill_names_the_job_and_where_it_looked() -> None:
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    with pytest.raises(DrillFailed, match="job 'orders' has no savepoint under"):
        newest_savepoint(catalog, storage_options={})


def test_drill_failed_is_the_error_tree_s_and_still_importable_from_the_drill() -> None:
    """Issue 47: every error in `exceptions.py`; `services.drill.DrillFailed` is the same class."""
    from airflow_sparkpoint import exceptions
    from airflow_sparkpoint.services import drill

    assert drill.DrillFailed is exceptions.DrillFailed
    assert issubclass(DrillFailed, exceptions.SparkpointError) and "DrillFailed" in exceptions.__all__
