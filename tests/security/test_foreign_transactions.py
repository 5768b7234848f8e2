"""What a forged transaction record in one job's store can no longer do (issue #46):

* settle another job's transaction: one job's store writer plants a record naming the
  other job's batch in a sink both share, and the first job's commit step, rollback or
  restore-time recovery aborted the other job's staged output;
* abort an upload that is not the transaction's own: a record naming ``s3://bucket`` (or
  the sink's prefix) and another application's pending multipart upload made the commit
  step abort it;
* make a Delta commit add files outside the transaction's own staging area (the table's
  data files again: duplicated rows; another job's staged files).

Local disk, moto's S3 and SeaweedFS's where the class applies.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, TransactionRecord
from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.runtime.recovery import settle_unconfirmed
from airflow_sparkpoint.runtime.restore_plan import RestorePlan
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.services.rollback import abort_generation
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import S3Sink
from airflow_sparkpoint.storage import LocalStorage
from tests.support.forgery import outcome
from tests.support.records import checkpoint_at, transaction_record

JOB, OTHER = "orders", "refunds"


def record(job: str, batch: int, generation: int, sink: Any, staged: dict[str, Any]) -> TransactionRecord:
    return transaction_record(sink, batch, generation, staged, job=job)


# ------------------------------------------------------------------- another job's record, a shared sink

SETTLERS: dict[str, Callable[[Catalog, Any], Any]] = {
    "commit step": lambda catalog, sink: commit_pending(catalog, sink=sink),
    "commit step, undeclared": lambda catalog, sink: commit_pending(catalog, storage_options=sink._options),
    "rollback": lambda catalog, sink: abort_generation(catalog, 1, sink=sink),
    "restore recovery": lambda catalog, sink: settle_unconfirmed(catalog, sink,
                                                                 RestorePlan(None, "empty state")),
}


def other_jobs_directory_staging(out: Path) -> tuple[DirectorySink, TransactionRecord, Path]:
    """The other job's staged batch in the shared directory sink, and a copy of its record."""
    sink = DirectorySink(str(out), "json")
    txn = f"{OTHER}-b1-g1"
    staging = out / "_staging" / txn
    staging.mkdir(parents=True)
    (staging / "part-00000.json").write_text('{"id": 1}\n')
    staged = {"format": "json", "staging": f"_staging/{txn}",
              "files": [{"path": "part-00000.json", "size": 10}], "bytes": 10}
    return sink, record(OTHER, 1, 1, sink, staged), staging / "part-00000.json"


@pytest.mark.parametrize("settler", sorted(SETTLERS))
def test_a_record_of_another_job_cannot_abort_its_staging_in_a_shared_directory_sink(
        tmp_path: Path, settler: str, caplog: pytest.LogCaptureFixture) -> None:
    sink, forged, staged_file = other_jobs_directory_staging(tmp_path / "shared-out")
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)  # batch 1 is below the latest checkpoint: the step would abort it
    catalog.put_transaction(forged)
    with caplog.at_level(logging.WARNING):
        outcome(SETTLERS[settler], catalog, sink)
    assert staged_file.exists(), f"the {settler} of job {JOB!r} aborted job {OTHER!r}'s staged batch"
    assert any(OTHER in r.getMessage() and "job" in r.getMessage() for r in caplog.records), \
        "the foreign record is not reported"


def test_a_snapshot_cannot_make_recovery_settle_another_jobs_transaction(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.recovery import recover_transactions

    sink, forged, staged_file = other_jobs_directory_staging(tmp_path / "shared-out")
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    meta = checkpoint_at(catalog, 3, pending=[forged])  # this job's own checkpoint lists it as confirmed
    plan = RestorePlan(catalog.snapshot(meta.id), "checkpoint", kind="checkpoint", base_id=meta.id,
                       own_files=True)
    _pending, summary = recover_transactions(catalog, sink, plan, "checkpoint", 1)
    assert summary["committed"] == [], "recovery committed another job's transaction"
    assert staged_file.exists() and not (tmp_path / "shared-out" / "part-refunds-b1-g1-00000.json").exists()


# ------------------------------------------------------------------- S3: only the transaction's own uploads


def s3_options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "region_name": "us-east-1",
            "aws_access_key_id": "test", "aws_secret_access_key": "test"}


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", **s3_options(endpoint))


def pending_upload(endpoint: str, bucket: str, key: str) -> dict[str, Any]:
    client = s3_client(endpoint)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1,
                              Body=b"x" * 10)["ETag"]
    return {"key": key, "upload_id": upload_id, "parts": [[1, etag]], "size": 10, "rows": 1}


def alive(endpoint: str, bucket: str, upload: dict[str, Any]) -> bool:
    uploads = s3_client(endpoint).list_multipart_uploads(Bucket=bucket).get("Uploads", ())
    return any(u["Key"] == upload["key"] and u["UploadId"] == upload["upload_id"] for u in uploads)


@pytest.fixture(params=["moto", "seaweedfs"])
def endpoint(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("s3_server" if request.param == "moto" else "seaweedfs_server"))


@pytest.fixture()
def bucket(endpoint: str) -> str:
    name = f"sp-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


@pytest.mark.s3
@pytest.mark.parametrize("declared", [False, True])
def test_a_record_cannot_make_the_commit_step_abort_another_applications_upload(
        endpoint: str, bucket: str, tmp_path: Path, declared: bool) -> None:
    # Undeclared, the record names the bucket itself; declared, the upload lies under the
    # sink's own prefix, where another application writes too.
    victim = pending_upload(endpoint, bucket, "out/other-app/data.bin" if declared else "other-app/data.bin")
    sink = S3Sink(f"s3://{bucket}/out" if declared else f"s3://{bucket}", "json")
    sink.configure(s3_options(endpoint))
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(record(JOB, 1, 1, sink, {"format": "json", "uploads": [victim]}))
    exc = outcome(commit_pending, catalog, storage_options=s3_options(endpoint),
                  sink=sink if declared else None)
    assert alive(endpoint, bucket, victim), "the commit step aborted another application's pending upload"
    assert isinstance(exc, SinkError) and "other-app/data.bin" in str(exc), exc


@pytest.mark.s3
def test_a_record_of_another_job_cannot_abort_its_uploads_in_a_shared_s3_sink(
        endpoint: str, bucket: str, tmp_path: Path) -> None:
    sink = S3Sink(f"s3://{bucket}/out", "json")
    sink.configure(s3_options(endpoint))
    theirs = pending_upload(endpoint, bucket, f"out/part-{OTHER}-b1-g1-00000.json")
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(record(OTHER, 1, 1, sink, {"format": "json", "uploads": [theirs]}))
    commit_pending(catalog, storage_options=s3_options(endpoint), sink=sink)
    assert alive(endpoint, bucket, theirs), \
        f"job {JOB!r}'s commit step aborted job {OTHER!r}'s pending upload"


@pytest.mark.s3
def test_an_aborted_transaction_still_aborts_its_own_uploads(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    sink = S3Sink(f"s3://{bucket}/out", "json")
    sink.configure(s3_options(endpoint))
    mine = pending_upload(endpoint, bucket, f"out/part-{JOB}-b1-g1-00000.json")
    stray = pending_upload(endpoint, bucket, f"out/part-{JOB}-b1-g1-00001.json")  # a retried task's
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(record(JOB, 1, 1, sink, {"format": "json", "uploads": [mine]}))
    result = commit_pending(catalog, storage_options=s3_options(endpoint), sink=sink)
    assert result["aborted"] == [f"{JOB}-b1-g1"]
    assert not alive(endpoint, bucket, mine) and not alive(endpoint, bucket, stray)


# -------------------------------------------------------------- Delta: added files from the staging area only


def delta_table(uri: str, options: dict[str, str] | None) -> tuple[Any, str, int]:
    """A table with one committed row; returns the schema, its data file's path and size."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64())}), storage_options=options)
    adds = pa.table(DeltaTable(uri, storage_options=options).get_add_actions(flatten=True)).to_pylist()
    [add] = adds
    return pa.schema([("id", pa.int64())]), str(add["path"]), int(add["size_bytes"])


def forged_append(schema: Any, files: list[str], size: int) -> dict[str, Any]:
    """The payload of an append whose files are `files` (each `size` bytes: as a careful forger writes it)."""
    staging = f"_sparkpoint_txn/{JOB}/{JOB}-b1-g1"
    return {"mode": "append", "staging": staging, "rows": len(files),
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
            "files": [{"path": path, "size": size, "partition_values": {}, "num_records": 1,
                       "modification_time": int(time.time() * 1000)} for path in files]}


def delta_rows(uri: str, options: dict[str, str] | None) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(uri, storage_options=options).to_pyarrow_table()["id"].to_pylist())


@pytest.mark.parametrize("outside", ["table data", "another job's staging", "climbing"])
def test_a_delta_commit_adds_files_only_from_the_transactions_own_staging(
    tmp_path: Path, outside: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_sparkpoint.sinks.delta import DeltaSink

    uri = str(tmp_path / "table")
    schema, data_file, data_size = delta_table(uri, None)
    theirs = tmp_path / "table" / "_sparkpoint_txn" / OTHER / f"{OTHER}-b1-g1" / "part-0.parquet"
    theirs.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([666], pa.int64())}), theirs)  # the other job's staged batch
    path, size = {"table data": (data_file, data_size),
                  "another job's staging": (f"_sparkpoint_txn/{OTHER}/{OTHER}-b1-g1/part-0.parquet",
                                            theirs.stat().st_size),
                  "climbing": (f"_sparkpoint_txn/{JOB}/{JOB}-b1-g1/../../../{data_file}", data_size)}[outside]
    sink = DeltaSink(uri)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    forged = record(JOB, 1, 1, sink, forged_append(schema, [path], size))
    catalog.put_transaction(forged)
    checkpoint_at(catalog, 1, pending=[forged])  # confirmed: the step commits it
    exc = outcome(commit_pending, catalog, sink=sink)
    assert delta_rows(uri, None) == [1], "the commit added a file from outside the transaction's staging area"
    assert isinstance(exc, SinkError) and "files[].path" in str(exc), exc


def test_a_delta_merge_reads_files_only_from_the_transactions_own_staging(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_sparkpoint.sinks.delta import DeltaSink

    uri = str(tmp_path / "table")
    schema, _data, _size = delta_table(uri, None)
    theirs = tmp_path / "table" / "_sparkpoint_txn" / OTHER / f"{OTHER}-b1-g1" / "part-0.parquet"
    theirs.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([666], pa.int64())}), theirs)
    sink = DeltaSink(uri, mode="merge", keys=["id"])
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    staged = {**forged_append(schema, [f"_sparkpoint_txn/{OTHER}/{OTHER}-b1-g1/part-0.parquet"],
                              theirs.stat().st_size), "mode": "merge"}
    forged = record(JOB, 1, 1, sink, staged)
    catalog.put_transaction(forged)
    checkpoint_at(catalog, 1, pending=[forged])
    exc = outcome(commit_pending, catalog, sink=sink)
    assert delta_rows(uri, None) == [1], "the merge took another job's staged rows"
    assert isinstance(exc, SinkError), exc


@pytest.mark.s3
def test_a_delta_commit_on_s3_adds_files_only_from_the_transactions_own_staging(
        s3_server_process: str, tmp_path: Path) -> None:
    from airflow_sparkpoint.sinks.delta import DeltaSink

    bucket = f"sp-{uuid.uuid4().hex[:12]}"
    s3_client(s3_server_process).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/table"
    sink = DeltaSink(uri)
    sink.configure(s3_options(s3_server_process))
    options = sink.location.delta_options()
    schema, data_file, data_size = delta_table(uri, options)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    forged = record(JOB, 1, 1, sink, forged_append(schema, [data_file], data_size))
    catalog.put_transaction(forged)
    checkpoint_at(catalog, 1, pending=[forged])
    exc = outcome(commit_pending, catalog, storage_options=s3_options(s3_server_process), sink=sink)
    assert delta_rows(uri, options) == [1], "the commit added the table's own data file again"
    assert isinstance(exc, SinkError) and data_file in str(exc), exc


def test_a_legitimate_record_still_commits(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_sparkpoint.sinks.delta import DeltaSink

    uri = str(tmp_path / "table")
    schema, _data, _size = delta_table(uri, None)
    own = f"_sparkpoint_txn/{JOB}/{JOB}-b1-g1/part-0.parquet"
    (tmp_path / "table" / own).parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([2], pa.int64())}), tmp_path / "table" / own)
    sink = DeltaSink(uri)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    staged = forged_append(schema, [own], (tmp_path / "table" / own).stat().st_size)
    good = record(JOB, 1, 1, sink, staged)
    catalog.put_transaction(good)
    checkpoint_at(catalog, 1, pending=[good])
    assert commit_pending(catalog, sink=sink)["committed"] == [good.txn_id]
    assert delta_rows(uri, None) == [1, 2]
    assert json.loads(json.dumps(catalog.transactions(), default=str)) == []
