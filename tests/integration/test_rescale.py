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

About 8 ``spark-submit`` runs (2-3 minutes on 2 busy cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.demo.support import (
    delta_commits,
    orphaned_staged_files,
    spark_submit_env,
    write_batch_file,
)
from airflow_sparkpoint.storage import open_storage

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "jobs" / "rescale_job.py"
JOB = "rescale"
USERS = 7
SPARK_CONF = {"spark.ui.enabled": "false", "spark.log.level": "WARN"}


def rows(index: int) -> list[dict[str, Any]]:
    return [{"user": f"u{u}", "amount": index * 100 + u * 7 + 1} for u in range(USERS) if (index + u) % 5]


def expected(files: int) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for index in range(files):
        for row in rows(index):
            total, count = totals.get(row["user"], (0, 0))
            totals[row["user"]] = (total + row["amount"], count + 1)
    return totals


def table(path: Path) -> dict[str, tuple[int, int]]:
    from deltalake import DeltaTable

    got = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert len({r["user"] for r in got}) == len(got), f"duplicate users: {got}"
    return {r["user"]: (r["total"], r["events"]) for r in got}


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        self.output = proc.stdout
        lines = [line for line in proc.stdout.splitlines() if line.startswith("SPARKPOINT_RESULT ")]
        self.result: dict[str, Any] | None = json.loads(lines[-1].split(" ", 1)[1]) if lines else None

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])


def submit(base: Path, pipeline: str, conf: dict[str, str], env: dict[str, str] | None = None,
           inputs: Path | None = None) -> Run:
    environment = spark_submit_env({**os.environ, **(env or {})})
    binary = shutil.which("spark-submit", path=environment["PATH"])
    assert binary, "spark-submit not found next to the interpreter"
    cmd = [binary, "--master", "local[2]"]
    settings = {**SPARK_CONF, "spark.sparkpoint.dir": str(base / "sp"), "spark.sparkpoint.job": JOB, **conf}
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [str(JOB_SCRIPT), "--pipeline", pipeline, "--input", str(inputs or base / "input"),
            "--output", str(base / "out")]
    proc = subprocess.run(cmd, check=False, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900)
    return Run(proc)


def finished(run: Run) -> dict[str, Any]:
    assert run.returncode == 0 and run.result is not None, run.tail()
    assert run.result["status"] == "finished", run.result
    return run.result


def catalog_of(base: Path) -> Catalog:
    return Catalog(open_storage(str(base / "sp")), JOB)


def offsets_conf(live_dir: str, batch: int) -> dict[str, str]:
    """The SQL conf Spark recorded with batch `batch` in its offset log."""
    lines = Path(live_dir, "offsets", str(batch)).read_text().splitlines()
    return dict(json.loads(lines[1])["conf"])


def list_json(capsys: pytest.CaptureFixture[str], base: Path) -> dict[str, Any]:
    code = cli.main(["list", "--dir", str(base / "sp"), "--job", JOB, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


class Built:
    """A finished first run of `pipeline` over `files` input files with `partitions`
    state partitions, and a savepoint of its last checkpoint."""

    def __init__(self, base: Path, pipeline: str, files: int, partitions: int) -> None:
        self.base, self.pipeline, self.files, self.partitions = base, pipeline, files, partitions
        for index in range(files):
            write_batch_file(base / "input", index, rows(index))
        result = finished(submit(base, pipeline, {"spark.sql.shuffle.partitions": str(partitions)}))
        assert result["last_batch"] == files - 1
        catalog = catalog_of(base)
        latest = catalog.latest()
        assert latest is not None and latest.state_partitions == partitions
        self.savepoint: SnapshotHandle = catalog.create_savepoint(catalog.handle(latest))
        self.savepoint_dir = Path(self.savepoint.uri.removeprefix("file://"))
        assert self.savepoint_dir.is_dir(), self.savepoint.uri
        assert table(base / "out") == expected(files)
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
        for index in range(present, present + count):
            write_batch_file(self.inputs, index, rows(index))
        return present + count

    def fork(self, base: Path) -> None:
        """A new job root with a copy of the output table as the savepoint left it."""
        shutil.copytree(self.saved_table, base / "out")


@pytest.fixture(scope="module")
def aggregation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    yield Built(tmp_path_factory.mktemp("rescale-aggregation"), "aggregation", files=3, partitions=2)


def test_aggregation_rescaled_up_then_down_keeps_totals_exact(aggregation, tmp_path, capsys, spark):
    from airflow_sparkpoint.runtime.inspect import inspect_snapshot

    built = aggregation
    built.fork(tmp_path)
    before = tree_digest(built.savepoint_dir)
    restored = built.savepoint.metadata.batch_id
    assert restored == built.files - 1

    # Up: the savepoint (2 partitions) restored into 4, with two more input files.
    files = built.add_files(2)
    up = finished(submit(tmp_path, "aggregation", {"spark.sparkpoint.restore": built.savepoint.uri,
                                                   "spark.sparkpoint.restore.statePartitions": "4"}, inputs=built.inputs))
    assert table(tmp_path / "out") == expected(files)
    synthetic = restored + 1  # the repartitioner's batch: no input, never staged
    new = files - built.files  # batches after the synthetic one (one file each)
    assert (up["first_batch"], up["last_batch"]) == (synthetic + 1, synthetic + new), up
    commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
    assert commits == [*range(built.files), *range(synthetic + 1, synthetic + new + 1)], commits
    catalog = catalog_of(tmp_path)
    checkpoints = {e.metadata.batch_id: e.metadata for e in catalog.list_checkpoints() if e.metadata}
    assert checkpoints[synthetic].state_partitions == 4, "the rescaled state is checkpointed right away"
    assert all(not m.transactions or all(t.batch_id != synthetic for t in m.transactions)
               for m in checkpoints.values())
    latest = catalog.latest()
    last = synthetic + new
    assert latest is not None and latest.batch_id == last and latest.state_partitions == 4
    assert offsets_conf(up["live_dir"], last)["spark.sql.shuffle.partitions"] == "4"
    assert tree_digest(built.savepoint_dir) == before, "the savepoint was modified (NO_CLAIM)"
    listed = {c["batch_id"]: c for c in list_json(capsys, tmp_path)["checkpoints"]}
    assert listed[last]["state_partitions"] == 4 and listed[synthetic]["state_partitions"] == 4

    # Down: the latest checkpoint (4 partitions) restored into 3, two more files.
    files = built.add_files(2)
    down = finished(submit(tmp_path, "aggregation", {"spark.sparkpoint.restore.statePartitions": "3"},
                           inputs=built.inputs))
    assert table(tmp_path / "out") == expected(files)
    second = last + 1  # the second rescale's synthetic batch
    assert (down["first_batch"], down["last_batch"]) == (second + 1, second + 2), down
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
    listed = {c["batch_id"]: c for c in list_json(capsys, tmp_path)["checkpoints"]}
    assert listed[second + 2]["state_partitions"] == 3 and listed[second]["state_partitions"] == 3
    assert tree_digest(built.savepoint_dir) == before
