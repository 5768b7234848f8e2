"""A writer of a sink's output location cannot make Sparkpoint act outside it (issue #46).

Whoever can write the output directory of a `DirectorySink` or the table directory of a
local `DeltaSink` can replace any entry Sparkpoint later walks through (``_staging``,
``_sparkpoint_txn/<job>``, a partition directory, a staging area) with a symbolic link to
a directory outside, and plant claims. Every test plants such a link, keeps a victim
outside every root, runs the sink's own commit, abort or orphan cleanup, and checks that
the link was still in place when the operation ran (the attack was really attempted),
that the victim is untouched and that nothing moved into or out of the output. Symbolic
links do not exist on S3: these classes have no S3 variant.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.sinks import DeltaSink
from airflow_sparkpoint.sinks.directory import DirectorySink
from tests.support.records import transaction_record
from tests.support.sink_files import sink_dir

JOB = "orders"
SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64())])


def outcome(action: Any, *args: Any, **kwargs: Any) -> BaseException | None:
    """Run `action`; what it raised (the victim is checked whatever it raised)."""
    try:
        action(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller asserts what it needs
        return exc
    return None


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes), links not followed."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            found[rel] = (b"->" + os.readlink(path).encode() if os.path.islink(path)
                          else Path(path).read_bytes())
    return found


def outside(tmp_path: Path, *names: str) -> tuple[Path, dict[str, bytes]]:
    """A directory outside every root holding `names` (files with known bytes) and a
    precious file; its snapshot to compare with after the attack."""
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "precious.txt").write_text("must survive")
    for name in names:
        (victim / name).parent.mkdir(parents=True, exist_ok=True)
        (victim / name).write_text(json.dumps({"id": 666, "from": "outside"}) + "\n")
    return victim, snapshot(victim)


def link(entry: Path, target: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(target, target_is_directory=True)


# ---------------------------------------------------------------------------- DirectorySink


def directory_record(sink: DirectorySink, batch: int, generation: int,
                     files: dict[str, int]) -> TransactionRecord:
    txn = f"{JOB}-b{batch}-g{generation}"
    staged = {"format": "json", "staging": f"_staging/{txn}",
              "files": [{"path": p, "size": s} for p, s in files.items()], "bytes": sum(files.values())}
    return transaction_record(sink, batch, generation, staged, job=JOB)


@pytest.fixture()
def staged_outside(tmp_path: Path) -> tuple[DirectorySink, TransactionRecord, Path, dict[str, bytes]]:
    """A directory sink whose ``_staging`` is a link to a directory outside that holds
    what looks like the staging area of batch 1 (a file the record names, same size)."""
    txn = f"{JOB}-b1-g1"
    victim, before = outside(tmp_path, f"{txn}/part-00000.json")
    out = tmp_path / "out"
    out.mkdir()
    link(out / "_staging", victim)
    sink = DirectorySink(str(out), "json")
    record = directory_record(sink, 1, 1,
                              {"part-00000.json": (victim / txn / "part-00000.json").stat().st_size})
    return sink, record, victim, before


def data_files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.json")
                  if not any(part.startswith("_") for part in p.relative_to(out).parts))


def test_a_symlinked_staging_area_is_not_promoted_into_the_output(staged_outside: Any) -> None:
    sink, record, victim, before = staged_outside
    out = sink_dir(sink)
    exc = outcome(sink.commit, record)
    assert (out / "_staging").is_symlink(), "the planted link was gone before the commit ran"
    assert snapshot(victim) == before, "the commit moved a file out of the directory outside"
    assert data_files(out) == [], "a file from outside became output"
    assert isinstance(exc, SparkpointError) and "_staging" in str(exc), \
        f"not refused naming _staging: {exc!r}"


def test_a_symlinked_staging_area_is_not_deleted_by_an_abort(staged_outside: Any) -> None:
    sink, record, victim, before = staged_outside
    out = sink_dir(sink)
    outcome(sink.abort, record)
    assert (out / "_staging").is_symlink() or not (out / "_staging").exists()
    assert snapshot(victim) == before, "the abort deleted files outside the output"


def test_a_symlinked_staging_area_is_not_swept_as_orphans(staged_outside: Any) -> None:
    sink, _record, victim, before = staged_outside
    out = sink_dir(sink)
    outcome(sink.cleanup_orphans, JOB, set())
    assert (out / "_staging").is_symlink() or not (out / "_staging").exists()
    assert snapshot(victim) == before, "orphan cleanup deleted files outside the output"


def plant_promoting_claim(out: Path, record: TransactionRecord, moves: list[list[Any]]) -> None:
    claim = out / "_sparkpoint" / "manifests" / JOB / f"{record.batch_id}.json"
    claim.parent.mkdir(parents=True, exist_ok=True)
    staging = f"_staging/{record.txn_id}"
    claim.write_text(json.dumps({
        "v": 2, "state": "promoting", "job": JOB, "batch_id": record.batch_id,
        "generation": record.generation,
        "txn_id": record.txn_id, "files": [{"path": dst, "size": size} for _src, dst, size in moves],
        "plan": {"staging": staging, "moves": moves}}))


def test_a_planted_promoting_claim_cannot_move_a_file_through_a_linked_directory(tmp_path: Path) -> None:
    """The claim's paths are confined (``sub/evil.py`` is inside the output), but ``sub``
    is a link to a DAGs folder: the move would land outside."""
    dags = tmp_path / "dags"
    dags.mkdir()
    out = tmp_path / "out"
    sink = DirectorySink(str(out), "json")
    evil = out / "_staging" / f"{JOB}-b2-g1" / "evil.py"
    evil.parent.mkdir(parents=True)
    evil.write_text("import os  # would run in the DAG processor\n")
    link(out / "sub", dags)
    record = directory_record(sink, 2, 1, {"evil.py": evil.stat().st_size})
    plant_promoting_claim(out, record,
                          [[f"_staging/{record.txn_id}/evil.py", "sub/evil.py", evil.stat().st_size]])
    exc = outcome(sink.commit, record)
    assert (out / "sub").is_symlink(), "the planted link was gone before the commit ran"
    assert list(dags.iterdir()) == [], "the promotion moved a file into the DAGs folder outside the output"
    assert isinstance(exc, SparkpointError) and "sub" in str(exc), f"not refused naming the link: {exc!r}"


def test_a_planted_promoting_claim_cannot_move_an_outside_file_in(tmp_path: Path) -> None:
    """The staging area named by the claim is a link to a directory outside: the moves
    would take a file from there into the output."""
    victim, before = outside(tmp_path, "secret.json")
    out = tmp_path / "out"
    sink = DirectorySink(str(out), "json")
    record = directory_record(sink, 3, 1, {"secret.json": (victim / "secret.json").stat().st_size})
    link(out / "_staging" / record.txn_id, victim)
    plant_promoting_claim(out, record, [[f"_staging/{record.txn_id}/secret.json", "secret.json",
                                         (victim / "secret.json").stat().st_size]])
    exc = outcome(sink.commit, record)
    assert (out / "_staging" / record.txn_id).is_symlink(), "the planted link was gone before the commit ran"
    assert snapshot(victim) == before, "the promotion moved a file out of the directory outside"
    assert data_files(out) == [], "a file from outside became output"
    assert isinstance(exc, SparkpointError) and record.txn_id in str(exc), \
        f"not refused naming the link: {exc!r}"


# ---------------------------------------------------------------------------- DeltaSink


def delta_record(sink: DeltaSink, batch: int, generation: int, victim: Path) -> TransactionRecord:
    """The record of a batch whose staging area is (through the link) in `victim`: a real
    parquet file, as the attacker would stage it for rows of their own."""
    txn = f"{JOB}-b{batch}-g{generation}"
    staging = f"_sparkpoint_txn/{JOB}/{txn}"
    name = f"part-00000-{txn}.snappy.parquet"
    (victim / txn).mkdir(exist_ok=True)
    pq.write_table(pa.table({"user": ["mallory"], "total": [666]}, schema=SCHEMA), victim / txn / name)
    files = [{"path": f"{staging}/{name}", "size": (victim / txn / name).stat().st_size,
              "partition_values": {}, "num_records": 1, "modification_time": int(time.time() * 1000)}]
    payload = {"mode": sink.mode, "staging": staging, "files": files, "rows": 1,
               "schema": base64.b64encode(SCHEMA.serialize().to_pybytes()).decode("ascii")}
    return transaction_record(sink, batch, generation, payload, job=JOB)


@pytest.fixture(params=["append", "merge"])
def delta_outside(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[DeltaSink, TransactionRecord, Path,
                                                                             dict[str, bytes]]:
    """A Delta table whose ``_sparkpoint_txn/<job>`` is a link to a directory outside
    holding a staging area of batch 1 and unrelated directories."""
    victim, _ = outside(tmp_path, "dags/dag.py", "backups/2026/db.dump")
    table = tmp_path / "table"
    table.mkdir()
    link(table / "_sparkpoint_txn" / JOB, victim)
    sink = DeltaSink(str(table), mode=request.param,
                     **({"keys": ["user"]} if request.param == "merge" else {}))
    record = delta_record(sink, 1, 1, victim)
    return sink, record, victim, snapshot(victim)


def table_users(sink: DeltaSink) -> list[str]:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(sink.path):
        return []
    return sorted(r["user"] for r in DeltaTable(sink.path).to_pyarrow_table().to_pylist())


def test_a_symlinked_delta_staging_root_is_not_committed(delta_outside: Any) -> None:
    sink, record, victim, before = delta_outside
    exc = outcome(sink.commit, record)
    assert (Path(sink.path) / "_sparkpoint_txn" / JOB).is_symlink(), \
        "the planted link was gone before the commit"
    assert snapshot(victim) == before, "the commit deleted or changed files outside the table"
    assert table_users(sink) == [], "rows from a directory outside the table became output"
    assert isinstance(exc, SparkpointError) and f"_sparkpoint_txn/{JOB}" in str(exc), \
        f"not refused naming the link: {exc!r}"


def test_a_symlinked_delta_staging_root_is_not_deleted_by_an_abort(delta_outside: Any) -> None:
    sink, record, victim, before = delta_outside
    outcome(sink.abort, record)
    assert (Path(sink.path) / "_sparkpoint_txn" / JOB).is_symlink(), \
        "the planted link was gone before the abort"
    assert snapshot(victim) == before, "the abort deleted files outside the table"


def test_a_symlinked_delta_staging_root_is_not_swept_as_orphans(delta_outside: Any) -> None:
    sink, _record, victim, before = delta_outside
    outcome(sink.cleanup_orphans, JOB, set())
    assert (Path(sink.path) / "_sparkpoint_txn" / JOB).is_symlink(), \
        "the planted link was gone before the sweep"
    assert snapshot(victim) == before, "restore-time orphan cleanup deleted files outside the table"


def test_delta_orphan_cleanup_deletes_only_this_jobs_transactions(tmp_path: Path) -> None:
    """A real staging root: names that are not transaction ids of this job are not the
    cleanup's to delete (another job's name, a planted directory)."""
    table = tmp_path / "table"
    root = table / "_sparkpoint_txn" / JOB
    for name in (f"{JOB}-b1-g1", "not-a-transaction", "other-b1-g1"):
        (root / name).mkdir(parents=True)
        (root / name / "f.parquet").write_bytes(b"x")
    sink = DeltaSink(str(table))
    assert sink.cleanup_orphans(JOB, set()) == 1
    assert sorted(p.name for p in root.iterdir()) == ["not-a-transaction", "other-b1-g1"]
