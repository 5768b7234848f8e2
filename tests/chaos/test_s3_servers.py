"""What the chaos trials on S3 rely on, verified against each running server (moto and
SeaweedFS) rather than assumed: a server that lacks a feature fails here, by name, and
the trials on it are not to be trusted until it is fixed or they are narrowed.

* ``PutObject`` with ``If-None-Match: *`` refuses an existing key (412) and, of racing
  writers of one new key, exactly one wins: Delta log entries (delta-rs
  ``conditional_put=etag``), the catalog's ``put_if_absent`` (generation claims,
  ``_metadata``, control acks), commit manifests.
* pending multipart uploads are listed under a prefix, and completing one makes the
  object visible and removes it from that listing (S3Sink's pre-commit and commit);
* server-side ``CopyObject`` and batch ``DeleteObjects`` (DirectorySink on S3, retention).
"""

from __future__ import annotations

import pytest

from tests.support.s3_servers import SERVERS, S3Context, probe_conditional_put

pytestmark = pytest.mark.s3


@pytest.mark.parametrize("server", SERVERS)
def test_conditional_put_is_refused_on_an_existing_key_and_exclusive_under_races(
    server: str, s3_servers: dict[str, S3Context]
) -> None:
    probe = probe_conditional_put(s3_servers[server], racers=8, rounds=10)
    assert probe["refuses_existing"], f"{server}: If-None-Match: * did not refuse an existing key: {probe}"
    assert probe["status"] == 412, probe
    assert probe["exclusive_races"] == probe["rounds"], f"{server}: racing conditional puts: {probe}"


@pytest.mark.parametrize("server", SERVERS)
def test_multipart_uploads_copy_and_batch_delete(server: str, s3_servers: dict[str, S3Context]) -> None:
    s3 = s3_servers[server]
    client = s3.client()
    pending = client.create_multipart_upload(Bucket=s3.bucket, Key="out/a.json")["UploadId"]
    other = client.create_multipart_upload(Bucket=s3.bucket, Key="elsewhere/b.json")["UploadId"]
    etag = client.upload_part(Bucket=s3.bucket, Key="out/a.json", UploadId=pending, PartNumber=1,
                              Body=b'{"id": 1}\n')["ETag"]

    def listed(prefix: str) -> list[str]:
        return [u["Key"]
                for u in client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get("Uploads", ())]

    assert listed("out/") == ["out/a.json"], f"{server}: uploads under a prefix"
    assert client.list_objects_v2(Bucket=s3.bucket, Prefix="out/").get("KeyCount", 0) == 0, \
        f"{server}: a pending upload must not be visible"
    client.complete_multipart_upload(Bucket=s3.bucket, Key="out/a.json", UploadId=pending,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert listed("out/") == [], f"{server}: a completed upload is still listed"
    assert client.get_object(Bucket=s3.bucket, Key="out/a.json")["Body"].read() == b'{"id": 1}\n'
    client.abort_multipart_upload(Bucket=s3.bucket, Key="elsewhere/b.json", UploadId=other)
    assert listed("elsewhere/") == []

    client.copy_object(Bucket=s3.bucket, Key="out/copy.json",
                       CopySource={"Bucket": s3.bucket, "Key": "out/a.json"})
    assert client.get_object(Bucket=s3.bucket, Key="out/copy.json")["Body"].read() == b'{"id": 1}\n'
    client.delete_objects(Bucket=s3.bucket,
                          Delete={"Objects": [{"Key": "out/a.json"}, {"Key": "out/copy.json"}]})
    assert client.list_objects_v2(Bucket=s3.bucket, Prefix="out/").get("KeyCount", 0) == 0


@pytest.mark.parametrize("server", SERVERS)
def test_the_catalog_claims_generations_exclusively(server: str, s3_servers: dict[str, S3Context]) -> None:
    """The catalog's own conditional create on this server: two claims of one generation
    number cannot both win (through `put_if_absent`)."""
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.exceptions import ObjectExists

    s3 = s3_servers[server]
    catalog = Catalog.open(f"s3://{s3.bucket}/root", "probe", **s3.options())
    catalog.store.put_if_absent("claims/1", b"first")
    with pytest.raises(ObjectExists):
        catalog.store.put_if_absent("claims/1", b"second")
    assert catalog.store.get("claims/1") == b"first"
    generations = [catalog.claim_generation().generation for _ in range(3)]
    assert generations == sorted(set(generations)) and len(generations) == 3, generations
