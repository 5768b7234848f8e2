"""A driver killed between Spark's file-source log entry ``sources/0/<k>`` and its
``offsets/<k>`` (seen in a CI chaos trial): the restart folds source-log batches k and
k+1 into one micro-batch (``offsets/k`` = ``{"logOffset": k+1}``). A checkpoint of that
batch must keep source-log entry k+1: without it, a restore from the checkpoint into a
fresh location assigns the next new file to source batch k+1, which its offsets already
count as done, and skips it. Real Spark (the test session's), real Delta table; the
expected ids come from the input files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.inputs import write_json_batches
from tests.support.state_cases import run_job

pytestmark = pytest.mark.spark

JOB = "folded"


def ids_query(spark: Any, inputs: Path) -> Any:
    return spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(inputs))


def _file(index: int) -> list[dict[str, int]]:
    return [{"id": index * 10 + i} for i in range(3)]


def _live(root: Path) -> Path:
    (offsets,) = [p for p in (root / JOB / "live").rglob("offsets") if p.is_dir()]
    return offsets.parent


def test_a_folded_source_batch_survives_a_restore_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    root, inputs, table = tmp_path / "sp", tmp_path / "in", tmp_path / "out"
    write_json_batches(inputs, [_file(0), _file(1)])
    first = run_job(spark, root, JOB, ids_query, inputs, table, {"mode": "append"}, "append")
    assert first.last_batch == 1

    # Spark planned batch 2 (its source log entry for file 2) and the driver died before offsets/2.
    write_json_batches(inputs, [_file(2)], start=2)
    live = _live(root)
    entry = json.loads((live / "sources" / "0" / "1").read_text().split("\n")[1])
    entry.update(path=entry["path"].replace("part-00001", "part-00002"), timestamp=entry["timestamp"] + 1000,
                 batchId=2)
    (live / "sources" / "0" / "2").write_text("v1\n" + json.dumps(entry))
    write_json_batches(inputs, [_file(3)], start=3)
    second = run_job(spark, root, JOB, ids_query, inputs, table, {"mode": "append"}, "append")
    offsets_2 = (live / "offsets" / "2").read_text().strip().split("\n")[-1]
    assert json.loads(offsets_2) == {"logOffset": 3}, "Spark did not fold source batches 2 and 3: no fault"
    assert second.last_batch == 2

    # Restore from the retained checkpoint in a fresh location, with one more file.
    shutil.rmtree(live)
    write_json_batches(inputs, [_file(4)], start=4)
    third = run_job(spark, root, JOB, ids_query, inputs, table, {"mode": "append"}, "append")
    assert third.restore_mode == "snapshot", third

    got = sorted(r["id"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist())
    assert got == sorted(r["id"] for i in range(5) for r in _file(i))
