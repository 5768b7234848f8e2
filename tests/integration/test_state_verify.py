"""``sparkpoint verify``: a healthy savepoint (and ``latest``) passes and the outcome is
recorded next to it; a flipped byte (same size), a truncated state file and a missing
file each fail with a message naming the file, and the failure is recorded; a state file
that matches ``_metadata`` but that Spark cannot read fails at the state read, naming
the operator and store (so the read really happens). Every corrupted snapshot is a copy
of a real aggregation savepoint, placed among the job's savepoints so that `list` shows
the outcome too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata, sha256_hex
from airflow_sparkpoint.checkpoints.verification import read_verification
from tests.support import state_cases
from tests.support.inputs import write_json_batches

pytestmark = pytest.mark.spark


class Job:
    def __init__(self, base: Path, catalog: Catalog, savepoint: SnapshotHandle,
                 case: state_cases.Case) -> None:
        self.root, self.input, self.table = base / "root", base / "input", base / "table"
        self.catalog, self.savepoint, self.case = catalog, savepoint, case


@pytest.fixture(scope="module")
def job(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Job:
    base = tmp_path_factory.mktemp("verify")
    case = state_cases.aggregation_case()
    write_json_batches(base / "input", case.files)
    result = state_cases.run_case(spark, case, str(base / "root"), "orders", base / "input", base / "table")
    assert result.status == "finished"
    catalog = Catalog.open(str(base / "root"), "orders")
    latest = catalog.latest()
    assert latest is not None
    return Job(base, catalog, catalog.create_savepoint(catalog.handle(latest)), case)


def run_cli(capsys: pytest.CaptureFixture[str], job: Job, target: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main(["verify", "--dir", str(job.root), "--job", "orders", target, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def listed(capsys: pytest.CaptureFixture[str], job: Job, uri: str) -> dict[str, Any]:
    assert cli.main(["list", "--dir", str(job.root), "--job", "orders", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [entry] = [e for e in doc["checkpoints"] + doc["savepoints"] if e["uri"] == uri]
    return entry


def record_of(job: Job, uri: str) -> Any:
    key = uri[len(job.catalog.uri) + 1:]
    return read_verification(job.catalog.store, key)


def copy_savepoint(job: Job, suffix: str) -> tuple[str, Path]:
    """A copy of the savepoint among the job's savepoints (same id, another suffix)."""
    source = Path(job.savepoint.uri.removeprefix("file://"))
    name = f"savepoint-{job.savepoint.metadata.id}-{suffix}"
    target = source.parent / name
    shutil.copytree(source, target)
    return f"{job.catalog.uri}/savepoints/{name}", target


def state_file(meta: SnapshotMetadata, suffix: str) -> FileRef:
    """The newest state file of operator 0, partition 0, with this suffix."""
    refs = [r for r in meta.files if r.path.startswith("state/0/0/") and r.path.endswith(suffix)]
    assert refs, f"no state/0/0/*{suffix} in {[r.path for r in meta.files]}"
    return max(refs, key=lambda r: int(r.path.rsplit("/", 1)[1].split(".")[0].split("_")[0]))


def test_healthy_savepoint_and_latest_pass_and_are_recorded(job, capsys):
    code, doc, err = run_cli(capsys, job, job.savepoint.uri)
    assert code == 0, err
    meta = job.savepoint.metadata
    assert (doc["ok"], doc["error"], doc["kind"], doc["batch_id"]) == (True, None, "savepoint", meta.batch_id)
    expected_rows = state_cases.row_count(job.case.expected["default"])
    assert (doc["checks"]
            == {"files": len(meta.files), "bytes": meta.total_bytes, "operators": 1, "partitions": 2,
                "stores": 1, "rows": expected_rows})
    record = record_of(job, job.savepoint.uri)
    assert record is not None and record.ok and record.level == "state"
    assert record.verified_at == doc["verified_at"] and record.checks["rows"] == expected_rows
    entry = listed(capsys, job, job.savepoint.uri)
    assert entry["valid"], "the record next to the snapshot must not make it invalid"
    assert (entry["verified_at"], entry["verify_error"]) == (doc["verified_at"], None)

    code, doc, err = run_cli(capsys, job, "latest")
    assert code == 0, err
    latest = job.catalog.latest()
    assert doc["uri"] == job.catalog.checkpoint_uri(latest.id) and doc["kind"] == "checkpoint" and doc["ok"]
    assert record_of(job, doc["uri"]).ok


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "missing"])
def test_damaged_file_fails_naming_the_file_and_is_recorded(job, capsys, damage):
    uri, path = copy_savepoint(job, damage.replace(" ", "")[:8])
    meta = SnapshotMetadata.from_bytes((path / "_metadata").read_bytes())
    ref = state_file(meta, ".changelog")
    target = path / ref.key
    data = target.read_bytes()
    if damage == "flipped byte":
        target.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
        assert target.stat().st_size == ref.size
        reason = f"{ref.key} is corrupt: its sha256 is"
    elif damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
        reason = f"{ref.key} has {len(data) // 2} bytes, expected {ref.size}"
    else:
        target.unlink()
        reason = f"{ref.key} is missing"

    code, doc, err = run_cli(capsys, job, uri)

    assert code == 1
    assert doc["ok"] is False and reason in doc["error"] and reason in err
    record = record_of(job, uri)
    assert record is not None and record.error == doc["error"] and record.level == "state"
    entry = listed(capsys, job, uri)
    assert entry["verify_error"] == doc["error"] and entry["verified_at"] == doc["verified_at"]


def test_state_spark_cannot_read_fails_at_the_read_naming_the_store(job, capsys):
    """A changelog cut short *before* the snapshot was taken: its size and checksum are the
    ones ``_metadata`` records, so only reading the state finds it."""
    uri, path = copy_savepoint(job, "unreadable")
    meta = SnapshotMetadata.from_bytes((path / "_metadata").read_bytes())
    ref = state_file(meta, ".changelog")
    damaged = (path / ref.key).read_bytes()[:7]
    (path / ref.key).write_bytes(damaged)
    files = tuple(r if r is not ref else FileRef(r.path, r.key, len(damaged), sha256_hex(damaged), r.mtime_ns)
                  for r in meta.files)
    (path / "_metadata").write_bytes(meta.with_(files=files).to_bytes())
    assert Catalog.open(str(job.root), "orders").list_savepoints(), "the re-signed copy must list as valid"

    code, doc, err = run_cli(capsys, job, uri)

    assert code == 1 and doc["ok"] is False and doc["error"] in err
    assert "operator 0 (stateStoreSave) store default cannot be read" in doc["error"], doc["error"]
    assert doc["checks"]["files"] == len(meta.files), "the file checks passed before the read"
    assert record_of(job, uri).error == doc["error"]
    # inspect of the same snapshot fails with one line, not a JVM stack trace
    code = cli.main(["inspect", "--dir", str(job.root), "--job", "orders", uri])
    err = capsys.readouterr().err
    assert code == 1 and f"cannot read the state of {uri}: " in err, err
    assert "Traceback" not in err and "at org.apache" not in err


def test_verify_of_nothing_fails_without_recording(job, capsys, tmp_path):
    code = cli.main(["verify", "--dir", str(job.root), "--job", "orders", str(tmp_path / "nowhere")])
    assert code == 1 and "has no _metadata" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_another_job_restoring_the_savepoint_into_other_output_leaves_its_pending_transactions(
    spark, job, tmp_path
):
    """What a drill (or a fork of the pipeline) does: restore a snapshot of job A as job B
    writing to another table. The snapshot lists A's last transaction as pending (it was
    committed to A's table after the checkpoint): B must neither commit it to its own
    table (its staged data is in A's) nor fail on it."""
    from deltalake import DeltaTable

    pending = job.savepoint.metadata.transactions
    assert [t.job for t in pending] == ["orders"], \
        "the savepoint lists no pending transaction: nothing to check"
    production = DeltaTable(str(job.table)).to_pyarrow_table().to_pylist()
    extra = [[{"user": "u0", "amount": 1000}, {"user": "u4", "amount": 7}]]
    write_json_batches(job.input, extra, start=len(job.case.files))

    result = state_cases.run_case(spark, job.case, str(tmp_path / "fork"), "orders-fork", job.input,
                                  tmp_path / "fork-table", restore=job.savepoint.uri,
                                  conf={"spark.sparkpoint.restore.allowForeignJob": "true"})

    assert result.status == "finished" and result.first_batch == job.savepoint.metadata.batch_id + 1
    totals = state_cases.aggregation_case().expected["default"]
    fork = {r["user"]: (r["total"], r["n"])
            for r in DeltaTable(str(tmp_path / "fork-table")).to_pyarrow_table().to_pylist()}
    assert fork == {"u0": (totals[(("u0",), None)][0] + 1000, totals[(("u0",), None)][1] + 1), "u4": (7, 1)}
    assert DeltaTable(str(job.table)).to_pyarrow_table().to_pylist() == production
