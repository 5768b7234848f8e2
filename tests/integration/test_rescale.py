"""Rescale on restore (``spark.sparkpoint.restore.statePartitions``) with real
``spark-submit`` drivers: a savepoint taken with one number of state partitions is
restored into another, up and down, for an aggregation and a transformWithState
pipeline. The oracle is computed from the input in plain Python: the Delta table must
hold exactly the per-user totals of every input row, each batch committed once, and the
repartitioner's synthetic batch (it appends one batch without input) never reaches the
sink. The savepoint is byte-for-byte unchanged (NO_CLAIM), the new partition count is
what the next checkpoint records, ``list --json`` and ``inspect`` show it.

Also: a driver killed during the rescale (fault point ``rescale``) leaves the savepoint
and the sink untouched and the retry succeeds; an operator the repartitioner cannot
handle is refused, by name, before anything is written; bad N is rejected.

Three ``spark-submit`` runs by default (about 2-3 minutes on 2 busy cores); the
transformWithState case (two more) is marked slow.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.demo.support import delta_commits, orphaned_staged_files
from airflow_sparkpoint.storage import open_storage
from tests.support.rescale_runs import (
    JOB,
    USERS,
    expected,
    finished,
    first_run,
    list_json,
    offsets_conf,
    run_in_process,
    submit,
    table,
    write_inputs,
)
from tests.support.trees import tree_digest

pytestmark = pytest.mark.spark


def catalog_of(base: Path) -> Catalog:
    return Catalog(open_storage(str(base / "sp")), JOB)


class Built:
    """A finished first run of `pipeline` over `files` input files with `partitions`
    state partitions, and a savepoint of its last checkpoint. The first run is not what
    is tested: it runs in the test session's Spark (saves a JVM start); every restore
    runs in its own ``spark-submit``."""

    def __init__(self, spark: Any, base: Path, pipeline: str, files: int, partitions: int) -> None:
        self.base, self.pipeline, self.files, self.partitions = base, pipeline, files, partitions
        first_run(spark, base, pipeline, files, partitions)
        catalog = catalog_of(base)
        latest = catalog.latest()
        assert latest is not None and latest.state_partitions == partitions
        self.savepoint: SnapshotHandle = catalog.create_savepoint(catalog.handle(latest))
        self.savepoint_dir = Path(self.savepoint.uri.removeprefix("file://"))
        assert self.savepoint_dir.is_dir(), self.savepoint.uri
        self.saved_table = base / "out-at-savepoint"
        shutil.copytree(base / "out", self.saved_table)

    @property
    def inputs(self) -> Path:
        """The input directory (shared: Spark's file source remembers the files it read by
        path, so a restored query must read the same directory)."""
        return self.base / "input"

    def add_files(self, count: int) -> int:
        """Write `count` more input files; return how many there are now."""
        present = len(list(self.inputs.glob("part-*.json")))
        write_inputs(self.inputs, present, present + count)
        return present + count

    def fork(self, base: Path) -> None:
        """A new job root with a copy of the output table as the savepoint left it."""
        shutil.copytree(self.saved_table, base / "out")


@pytest.fixture(scope="module")
def aggregation(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    yield Built(spark, tmp_path_factory.mktemp("rescale-aggregation"), "aggregation", files=3, partitions=2)


def dead_generation_live_dir(catalog: Catalog) -> Path:
    [origin] = catalog.origins()
    assert origin.live_dir, origin
    return Path(origin.live_dir)


def test_aggregation_killed_during_rescale_then_rescaled_up_and_down_exactly(
    aggregation, tmp_path, capsys, spark
):
    """A kill in the middle of the repartition (fault point ``rescale``) leaves the
    savepoint and the sink untouched; the retry (restore=latest, as the operator's retry)
    rescales 2 -> 4; a later restore rescales 4 -> 3. Totals exact after each."""
    from airflow_sparkpoint.runtime.state_inspect import inspect_snapshot
    from airflow_sparkpoint.runtime.verify import verify_snapshot

    built = aggregation
    built.fork(tmp_path)
    savepoint_before = tree_digest(built.savepoint_dir)
    table_before = tree_digest(tmp_path / "out")
    restored = built.savepoint.metadata.batch_id
    synthetic = restored + 1  # the repartitioner's batch: no input, never staged
    catalog = catalog_of(tmp_path)
    files = built.add_files(2)

    marker = tmp_path / "fault-fired"
    killed = submit(tmp_path, "aggregation", {"spark.sparkpoint.restore": built.savepoint.uri,
                                              "spark.sparkpoint.restore.statePartitions": "4"},
                    env={"SPARKPOINT_TEST_FAULT": f"rescale:{restored}",
                         "SPARKPOINT_TEST_FAULT_ONCE": str(marker)},
                    inputs=built.inputs)
    assert killed.returncode != 0, killed.tail()
    assert marker.read_text().strip() == f"rescale:{restored}", "the fault point was not reached"
    live = dead_generation_live_dir(catalog)
    assert offsets_conf(str(live), synthetic)["spark.sql.shuffle.partitions"] == "4", \
        "killed before the repartitioner started"
    from airflow_sparkpoint.runtime.rescale import interrupted
    if not (live / "commits" / str(synthetic)).exists():  # killed before Spark's commit, as intended
        assert interrupted(str(live), restored)
    assert tree_digest(built.savepoint_dir) == savepoint_before, "the killed rescale modified the savepoint"
    assert tree_digest(tmp_path / "out") == table_before, "the killed rescale touched the sink"
    assert catalog.latest() is None and catalog.transactions() == []

    # The retry: the lineage the killed try started from the savepoint, rescaled again.
    up = finished(submit(tmp_path, "aggregation", {"spark.sparkpoint.restore": "latest",
                                                   "spark.sparkpoint.restore.statePartitions": "4"},
                         inputs=built.inputs))
    assert up["restored_from"] == built.savepoint.uri and up["live_dir"] != str(live)
    assert up["rescaled"] == {"from": 2, "to": 4, "batch": synthetic}
    assert table(tmp_path / "out") == expected(files)
    new = files - built.files  # batches after the synthetic one (one file each)
    last = synthetic + new
    assert (up["first_batch"], up["last_batch"]) == (synthetic + 1, last), up
    commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
    assert commits == [*range(built.files), *range(synthetic + 1, last + 1)], commits
    checkpoints = {e.metadata.batch_id: e.metadata for e in catalog.list_checkpoints() if e.metadata}
    assert checkpoints[synthetic].state_partitions == 4, "the rescaled state is checkpointed right away"
    assert all(t.batch_id != synthetic for m in checkpoints.values() for t in m.transactions)
    latest = catalog.latest()
    assert latest is not None and latest.batch_id == last and latest.state_partitions == 4
    assert offsets_conf(up["live_dir"], last)["spark.sql.shuffle.partitions"] == "4"
    assert tree_digest(built.savepoint_dir) == savepoint_before, "the savepoint was modified (NO_CLAIM)"
    listed = {c["batch_id"]: c for c in list_json(capsys, str(tmp_path / "sp"))["checkpoints"]}
    assert listed[last]["state_partitions"] == 4 and listed[synthetic]["state_partitions"] == 4

    # Down: the latest checkpoint (4 partitions) restored into 3, two more files.
    files = built.add_files(2)
    down = finished(submit(tmp_path, "aggregation", {"spark.sparkpoint.restore.statePartitions": "3"},
                           inputs=built.inputs))
    assert table(tmp_path / "out") == expected(files)
    second = last + 1  # the second rescale's synthetic batch
    assert (down["first_batch"], down["last_batch"]) == (second + 1, second + 2), down
    assert down["rescaled"] == {"from": 4, "to": 3, "batch": second}
    commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
    assert commits[-3:] == [last, second + 1, second + 2], commits
    assert len(commits) == len(set(commits)) and synthetic not in commits and second not in commits
    latest = catalog.latest()
    assert latest is not None and latest.state_partitions == 3
    assert offsets_conf(down["live_dir"], second + 2)["spark.sql.shuffle.partitions"] == "3"
    assert orphaned_staged_files(tmp_path / "out", JOB) == []
    state = inspect_snapshot(spark, catalog.checkpoint_uri(latest.id))
    [op] = state.operators
    assert op.partitions == 3 and [s.rows for s in op.stores] == [USERS]
    drill = verify_snapshot(catalog.handle(latest), spark=spark)  # every partition of every store reads
    assert drill.ok and drill.checks["partitions"] == 3 and drill.checks["rows"] == USERS, drill
    listed = {c["batch_id"]: c for c in list_json(capsys, str(tmp_path / "sp"))["checkpoints"]}
    assert listed[second + 2]["state_partitions"] == 3 and listed[second]["state_partitions"] == 3
    assert tree_digest(built.savepoint_dir) == savepoint_before


@pytest.mark.slow
def test_transform_with_state_rescaled_down_then_up_exactly(tmp_path, capsys, spark):
    """transformWithStateInPandas (a ValueState per user): 3 -> 2 from a savepoint, then
    2 -> 5 from the latest checkpoint."""
    from airflow_sparkpoint.runtime.state_inspect import inspect_snapshot

    built = Built(spark, tmp_path / "build", "tws", files=3, partitions=3)
    built.fork(tmp_path)
    before = tree_digest(built.savepoint_dir)
    catalog = catalog_of(tmp_path)
    for target, restore in ((2, built.savepoint.uri), (5, "latest")):
        files = built.add_files(2)
        run = finished(submit(tmp_path, "tws", {"spark.sparkpoint.restore": restore,
                                                "spark.sparkpoint.restore.statePartitions": str(target)},
                              inputs=built.inputs))
        assert table(tmp_path / "out") == expected(files), target
        assert (run["rescaled"]
                == {"from": 3 if target == 2 else 2, "to": target, "batch": run["first_batch"] - 1})
        commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
        assert len(commits) == len(set(commits)) and run["first_batch"] - 1 not in commits, commits
        latest = catalog.latest()
        assert latest is not None and latest.state_partitions == target
        assert offsets_conf(run["live_dir"], run["last_batch"])["spark.sql.shuffle.partitions"] == str(target)
        state = inspect_snapshot(spark, catalog.checkpoint_uri(latest.id))
        [op] = state.operators
        assert op.name == "transformWithStateInPandasExec" and op.partitions == target
        assert [s.rows for s in op.stores] == [USERS]
        listed = {c["batch_id"]: c for c in list_json(capsys, str(tmp_path / "sp"))["checkpoints"]}
        assert listed[latest.batch_id]["state_partitions"] == target
    assert tree_digest(built.savepoint_dir) == before


# ------------------------------------------------------------------ refused before anything is written
# In the test session's Spark (the refusal is the driver's pre-check; no query runs).


def test_an_unsupported_operator_is_refused_by_name_before_anything_is_written(spark, tmp_path):
    from airflow_sparkpoint.exceptions import RestoreError

    write_inputs(tmp_path / "input", 0, 2)
    result = run_in_process(spark, tmp_path, "limit", {"spark.sparkpoint.restore": "latest"})
    assert result.status == "finished"
    catalog = catalog_of(tmp_path)
    latest = catalog.latest()
    assert latest is not None
    savepoint = catalog.create_savepoint(catalog.handle(latest))
    write_inputs(tmp_path / "input", 2, 3)
    root_before, table_before = tree_digest(tmp_path / "sp"), tree_digest(tmp_path / "out")
    generation = catalog.current_generation()

    for restore in (savepoint.uri, "latest"):
        with pytest.raises(RestoreError,
                           match=r"statePartitions=4: operator 0 \(globalLimit\) of .* cannot be "
                                 r"repartitioned; Spark's offline state repartitioner supports"):
            run_in_process(spark, tmp_path, "limit", {"spark.sparkpoint.restore": restore,
                                                       "spark.sparkpoint.restore.statePartitions": "4"})
    assert catalog.current_generation() == generation, "a generation was claimed"
    assert tree_digest(tmp_path / "sp") == root_before, "the refused restore wrote to the job's root"
    assert tree_digest(tmp_path / "out") == table_before, "the refused restore touched the sink"


@pytest.mark.parametrize("value", ["0", "-1", "four", "2.5"])
def test_bad_state_partitions_are_rejected_before_anything_is_written(spark, tmp_path, value):
    from airflow_sparkpoint.exceptions import ConfigError

    with pytest.raises(ConfigError,
                       match=rf"spark\.sparkpoint\.restore\.statePartitions='{value}' is (too small|"
                             r"not an integer); expected an integer >= 1"):
        run_in_process(spark, tmp_path, "aggregation", {"spark.sparkpoint.restore.statePartitions": value})
    assert not (tmp_path / "sp").exists() and not (tmp_path / "out").exists()
