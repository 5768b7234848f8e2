"""S3 keys are literal: ``a//b/x`` and ``a/b/x`` are two objects. An `S3Sink` refuses a
destination that is not a canonical key prefix, and its commit refuses a recorded key
that is not canonical instead of completing an upload under a rewritten key (moto)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.exceptions import ConfigError, SinkError
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import MIN_PART_SIZE, S3Sink
from tests.support.records import transaction_record

pytestmark = pytest.mark.s3

JOB = "orders"


@pytest.mark.parametrize("path", ["a//b", "a/./b", "a/../b"])
def test_a_destination_that_is_not_a_canonical_key_prefix_is_refused(path: str) -> None:
    for make in (S3Sink, DirectorySink):
        with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
            make(f"s3://b-ok/{path}")
    assert S3Sink("s3://b-ok//a/b/").prefix == "a/b/"  # only the ends' slashes go, as before


def staged(client: Any, bucket: str, key: str) -> dict[str, Any]:
    """A pending multipart upload of one part at the literal `key`, as the sink records it."""
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    body = b"x" * MIN_PART_SIZE
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=body)["ETag"]
    return {"key": key, "upload_id": upload_id, "parts": [[1, etag]], "size": len(body), "rows": 1}


def test_a_recorded_key_that_is_not_canonical_is_refused_not_rewritten(
    s3_server: str, s3_bucket: str
) -> None:
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    sink = S3Sink(f"s3://{s3_bucket}/out")
    sink.configure({"endpoint_url": s3_server, "region_name": "us-east-1"})
    txn = layout.txn_id(JOB, 0, 1)
    name = manifests.final_name(txn, 0, "parquet")
    upload = staged(client, s3_bucket, f"out//{name}")
    record = transaction_record(sink, 0, 1, {"uploads": [upload]}, job=JOB)
    with pytest.raises(SinkError, match="not canonical") as info:
        sink.commit(record)
    assert f"out//{name}" in str(info.value)
    listed = client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert listed == [], f"nothing may be written for a refused record: {[o['Key'] for o in listed]}"
    pending = client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["Key"] for u in pending] == [f"out//{name}"], "the refused upload is left as it was"
