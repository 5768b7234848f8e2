"""`S3Sink` and `DirectorySink` without Spark or a server: configuration errors, part
sizing, and the S3 answers moto does not give (truncated upload listings, NoSuchUpload
on a completed upload), replayed with botocore's Stubber."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.exceptions import CommitOutcomeUnknown, ConfigError, SinkError
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.sinks.s3 import (
    MAX_PARTS,
    MIN_PART_SIZE,
    MiB,
    S3Sink,
    choose_part_size,
    multipart_etag,
)
from airflow_sparkpoint.storage.s3 import S3Storage

BUCKET = "sp-unit"


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        (("s3://b-ok/x", "xml"), {}, "'xml'"),
        (("/tmp/not-s3",), {}, "/tmp/not-s3"),
        (("s3://Bad_Bucket/x",), {}, "Bad_Bucket"),
        (("s3://b-ok/x",), {"part_size": 1024}, "1024"),
        (("s3://b-ok/x",), {"part_size": True}, "True"),
    ],
)
def test_s3_sink_rejects_bad_configuration_naming_the_value(args: tuple[Any, ...], kwargs: dict[str, Any],
                                                            named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        S3Sink(*args, **kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        (("/tmp/out", "xml"), {}, "'xml'"),
        (("hdfs://nn/out",), {}, "hdfs://nn/out"),
        (("memory://x/out",), {}, "memory://x/out"),
        (("/tmp/out",), {"partition_by": ["country", ""]}, "['country', '']"),
        (("/tmp/out",), {"options": {"compression": ["gzip"]}}, "compression"),
    ],
)
def test_directory_sink_rejects_bad_configuration_naming_the_value(
    args: tuple[Any, ...], kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        DirectorySink(*args, **kwargs)


def test_sinks_normalise_their_identity_and_config() -> None:
    s3 = S3Sink("s3a://b-ok/some/prefix/", "json", part_size=8 * MiB)
    assert s3.sink_id == "s3://b-ok/some/prefix"
    assert s3.to_config() == {"uri": "s3://b-ok/some/prefix", "format": "json", "part_size": 8 * MiB}
    local = DirectorySink("relative/out", "csv", partition_by=["d"], options={"header": True})
    assert local.sink_id.startswith("file:///") and local.sink_id.endswith("/relative/out")
    assert DirectorySink(**local.to_config()).to_config() == local.to_config()


def test_part_size_grows_to_stay_within_10000_parts() -> None:
    assert choose_part_size(1) == MIN_PART_SIZE
    assert choose_part_size(6 * MiB, 8 * MiB) == 8 * MiB
    big = 200 * 1024 * MiB  # 200 GiB
    part = choose_part_size(big)
    assert part % MiB == 0 and -(-big // part) <= MAX_PARTS
    with pytest.raises(SinkError, match="5 TiB"):
        choose_part_size(6 * 1024 * 1024 * MiB)


def test_a_committed_file_name_names_its_transaction() -> None:
    txn = layout.txn_id("orders-b7-g1", 12, 3)
    assert manifests.part_txn(manifests.final_name(txn, 4, "parquet")) == txn
    assert manifests.final_name(txn, 4, "parquet").startswith(manifests.part_prefix(txn))
    assert manifests.part_txn(f"{manifests.part_prefix(txn)}00004") is None  # no extension: not a part file


@pytest.fixture()
def stubbed() -> Any:
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    sink = S3Sink(f"s3://{BUCKET}/out")
    sink._store = S3Storage(BUCKET, "out", client=client)
    with Stubber(client) as stubber:
        yield sink, stubber
        stubber.assert_no_pending_responses()


UPLOAD: dict[str, Any] = {
    "key": "out/part-orders-b0-g1-00000.parquet",
    "upload_id": "u-1",
    "parts": [[1, '"0cc175b9c0f1b6a831c399e269772661"'], [2, '"92eb5ffee6ae2fec3ad71c777531578f"']],
    "size": 6 * MiB,
}


def _complete_params() -> dict[str, Any]:
    return {"Bucket": BUCKET, "Key": UPLOAD["key"], "UploadId": "u-1",
            "MultipartUpload": {"Parts": [{"PartNumber": n, "ETag": e} for n, e in UPLOAD["parts"]]}}


def test_completing_an_upload_s3_already_completed_counts_as_already(stubbed: Any) -> None:
    sink, stubber = stubbed
    stubber.add_client_error("complete_multipart_upload", "NoSuchUpload", http_status_code=404,
                             expected_params=_complete_params())
    stubber.add_response("head_object",
                         {"ContentLength": 6 * MiB, "ETag": f'"{multipart_etag(UPLOAD["parts"])}"'},
                         {"Bucket": BUCKET, "Key": UPLOAD["key"]})

    assert sink._complete(UPLOAD) == "already"


def test_a_vanished_upload_without_its_object_is_a_certain_failure(stubbed: Any) -> None:
    sink, stubber = stubbed
    stubber.add_client_error("complete_multipart_upload", "NoSuchUpload", http_status_code=404)
    stubber.add_client_error("head_object", "404", http_status_code=404)
    stubber.add_client_error("list_parts", "NoSuchUpload", http_status_code=404)

    with pytest.raises(SinkError, match="lifecycle") as info:
        sink._complete(UPLOAD)
    assert not isinstance(info.value, CommitOutcomeUnknown)


def test_an_object_of_another_size_is_not_taken_for_ours(stubbed: Any) -> None:
    sink, stubber = stubbed
    stubber.add_client_error("complete_multipart_upload", "NoSuchUpload", http_status_code=404)
    stubber.add_response("head_object", {"ContentLength": 5, "ETag": '"x"'})
    stubber.add_client_error("list_parts", "NoSuchUpload", http_status_code=404)

    with pytest.raises(SinkError, match="no longer exists"):
        sink._complete(UPLOAD)


def test_a_server_error_with_the_upload_still_pending_is_an_unknown_outcome(stubbed: Any) -> None:
    sink, stubber = stubbed
    stubber.add_client_error("complete_multipart_upload", "InternalError", http_status_code=500)
    stubber.add_client_error("head_object", "404", http_status_code=404)
    stubber.add_response("list_parts", {"Parts": []})

    with pytest.raises(CommitOutcomeUnknown, match="run the commit again"):
        sink._complete(UPLOAD)


def test_pending_uploads_follow_truncated_listings(stubbed: Any) -> None:
    sink, stubber = stubbed
    first = [{"Key": f"out/part-orders-b{i}-g1-00000.parquet", "UploadId": f"u{i}"} for i in range(1000)]
    stubber.add_response(
        "list_multipart_uploads",
        {"Uploads": first, "IsTruncated": True, "NextKeyMarker": first[-1]["Key"],
         "NextUploadIdMarker": "u999"},
        {"Bucket": BUCKET, "Prefix": "out/part-orders-"},
    )
    stubber.add_response(
        "list_multipart_uploads",
        {"Uploads": [{"Key": "out/part-orders-b1000-g1-00000.parquet", "UploadId": "u1000"},
                     {"Key": "out/part-orders-x-b1-g1-00000.parquet", "UploadId": "foreign"}],
         "IsTruncated": False},
        {"Bucket": BUCKET, "Prefix": "out/part-orders-", "KeyMarker": first[-1]["Key"],
         "UploadIdMarker": "u999"},
    )

    found = sink.pending_uploads("orders")

    assert len(found) == 1001
    assert found[-1] == ("orders-b1000-g1", "out/part-orders-b1000-g1-00000.parquet", "u1000")
