"""Claims and decisions planted in an S3 output location (issue #28): their plans name
keys and uploads, and whoever can write the output location can write any of them; none
may make a sink complete, abort or delete anything outside its prefix, nor move an
attacker's object into another prefix."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import InvalidPath, SinkError
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import S3Sink
from airflow_sparkpoint.storage import open_storage
from tests.support.forgery import JOB, assert_refused, forged_record, outcome, s3_objects

pytestmark = pytest.mark.s3

VICTIM = "victims/precious.txt"


def s3_options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "region_name": "us-east-1",
            "aws_access_key_id": "test", "aws_secret_access_key": "test"}


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", **s3_options(endpoint))


def fresh_bucket(endpoint: str) -> str:
    bucket = f"sp-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    return bucket


def attacker_upload(endpoint: str, bucket: str, key: str, body: bytes) -> dict[str, Any]:
    """A pending one-part upload of `body` to `key`, as a plan's upload names it."""
    client = s3_client(endpoint)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=body)["ETag"]
    return {"key": key, "upload_id": upload_id, "parts": [[1, etag]], "size": len(body), "rows": 1}


def s3_sink(endpoint: str, bucket: str) -> S3Sink:
    sink = S3Sink(f"s3://{bucket}/out", "json")
    sink.configure(s3_options(endpoint))
    return sink


def pending_keys(endpoint: str, bucket: str) -> list[str]:
    uploads = s3_client(endpoint).list_multipart_uploads(Bucket=bucket).get("Uploads", ())
    return sorted(u["Key"] for u in uploads)


def victim_body(endpoint: str, bucket: str) -> bytes:
    return bytes(s3_client(endpoint).get_object(Bucket=bucket, Key=VICTIM)["Body"].read())


def test_planted_promoting_claim_cannot_complete_an_upload_outside_the_prefix(s3_server: str,
                                                                             s3_bucket: str) -> None:
    open_storage(f"s3://{s3_bucket}", **s3_options(s3_server)).put(VICTIM, b"must survive")
    evil = attacker_upload(s3_server, s3_bucket, VICTIM, b"overwritten")
    sink = s3_sink(s3_server, s3_bucket)
    record = forged_record(4, 1, sink.to_config(), {"uploads": []}, sink_kind="s3")
    sink._storage().put(f"_sparkpoint/manifests/{JOB}/4.json", json.dumps({
        "state": "promoting", "job": JOB, "batch_id": 4, "generation": 1, "txn_id": record.txn_id,
        "files": [], "plan": {"uploads": [evil]}}).encode())
    exc = outcome(sink.commit, record)
    assert victim_body(s3_server, s3_bucket) == b"must survive", "a planted claim overwrote an object outside"
    assert_refused(exc, (SinkError, InvalidPath), VICTIM)


def test_planted_promote_decision_cannot_make_an_abort_touch_an_upload_outside(s3_server: str,
                                                                              s3_bucket: str) -> None:
    open_storage(f"s3://{s3_bucket}", **s3_options(s3_server)).put(VICTIM, b"must survive")
    # someone else's upload in progress outside the sink's prefix
    theirs = attacker_upload(s3_server, s3_bucket, VICTIM, b"their new version")
    sink = s3_sink(s3_server, s3_bucket)
    record = forged_record(5, 1, sink.to_config(), {"uploads": []}, sink_kind="s3")
    sink._storage().put(f"_sparkpoint/decisions/{JOB}/{record.txn_id}.json", json.dumps({
        "schema_version": 1, "decision": "promote", "job": JOB, "batch_id": 5, "generation": 1,
        "txn_id": record.txn_id, "decided_at": 0, "files": [], "plan": {"uploads": [theirs]}}).encode())
    exc = outcome(sink.abort, record)
    assert victim_body(s3_server, s3_bucket) == b"must survive", \
        "a planted decision completed an upload outside"
    assert pending_keys(s3_server, s3_bucket) == [VICTIM], "a planted decision aborted an upload outside"
    assert_refused(exc, (SinkError, InvalidPath), VICTIM)


def test_planted_claim_of_another_txn_cannot_make_a_loser_abort_an_upload_outside(s3_server: str,
                                                                                 s3_bucket: str) -> None:
    theirs = attacker_upload(s3_server, s3_bucket, VICTIM, b"their new version")
    sink = s3_sink(s3_server, s3_bucket)
    record = forged_record(6, 1, sink.to_config(), {"uploads": []}, sink_kind="s3")
    # the batch is held by another transaction, and this one's decision is a planted promote
    sink._storage().put(f"_sparkpoint/manifests/{JOB}/6.json", json.dumps({
        "state": "done", "job": JOB, "batch_id": 6, "generation": 2, "txn_id": f"{JOB}-b6-g2",
        "files": [], "plan": {"uploads": []}}).encode())
    sink._storage().put(f"_sparkpoint/decisions/{JOB}/{record.txn_id}.json", json.dumps({
        "schema_version": 1, "decision": "promote", "job": JOB, "batch_id": 6, "generation": 1,
        "txn_id": record.txn_id, "decided_at": 0, "files": [], "plan": {"uploads": [theirs]}}).encode())
    exc = outcome(claims_settle, sink, record)
    assert pending_keys(s3_server, s3_bucket) == [VICTIM], "a planted decision aborted an upload outside"
    assert_refused(exc, (SinkError, InvalidPath), VICTIM)


def claims_settle(sink: S3Sink, record: Any) -> str:
    """Settle `record` with no plan of its own (as `cleanup_orphans` does): the decision's plan is used."""
    from airflow_sparkpoint.sinks import _claims

    return _claims.settle(sink, record, None)


# ------------------------------------------------------------------ attack 4 on S3: a promoting claim's moves


def planted_moves_cannot_move_an_object_out(endpoint: str, bucket: str) -> None:
    options = s3_options(endpoint)
    root = open_storage(f"s3://{bucket}", **options)
    root.put("attacker/evil.py", b"import os  # runs in the DAG processor\n")
    sink = DirectorySink(f"s3://{bucket}/out", "json")
    sink.configure(options)
    txn = f"{JOB}-b5-g1"
    body = json.dumps({"id": 5}).encode() + b"\n"
    root.put(f"out/_staging/{txn}/part-00000.json", body)
    record = forged_record(5, 1, sink.to_config(), {"format": "json", "staging": f"_staging/{txn}",
                                                    "files": [{"path": "part-00000.json", "size": len(body)}],
                                                    "bytes": len(body)})
    claim = {
        "state": "promoting", "job": JOB, "batch_id": 5, "generation": 1, "txn_id": txn, "files": [],
        "plan": {"staging": f"_staging/{txn}", "moves": [["../attacker/evil.py", "../dags/evil.py", 40]]}}
    root.put(f"out/_sparkpoint/manifests/{JOB}/5.json", json.dumps(claim).encode())
    exc = outcome(sink.commit, record)
    objects = s3_objects(endpoint, bucket)
    assert "attacker/evil.py" in objects, "the planted object was moved"
    assert not [o for o in objects if o.startswith("dags/")], "an object was moved into another prefix"
    assert_refused(exc, (SinkError, InvalidPath), "evil")


def test_planted_promoting_claim_cannot_move_an_object_out_moto(s3_server: str, s3_bucket: str) -> None:
    planted_moves_cannot_move_an_object_out(s3_server, s3_bucket)


def test_planted_promoting_claim_cannot_move_an_object_out_seaweedfs(seaweedfs_server: str) -> None:
    planted_moves_cannot_move_an_object_out(seaweedfs_server, fresh_bucket(seaweedfs_server))


# ------------------------------------------------------------------- readers: committed_files


def test_a_planted_done_claim_cannot_point_readers_outside_the_prefix(s3_server: str, s3_bucket: str) -> None:
    sink = s3_sink(s3_server, s3_bucket)
    sink._storage().put(f"_sparkpoint/manifests/{JOB}/7.json", json.dumps({
        "state": "done", "job": JOB, "batch_id": 7, "generation": 1, "txn_id": f"{JOB}-b7-g1",
        "files": [{"key": VICTIM, "size": 1}], "plan": {"uploads": []}}).encode())
    exc = outcome(sink.committed_files, JOB)
    assert_refused(exc, (SinkError, InvalidPath), VICTIM)
