"""`Storage.at`: another location on a store's own service, reached with its own options
(the commit step reads a moved savepoint through it), and None on another service."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.exceptions import InvalidPath
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage
from airflow_sparkpoint.storage.s3 import S3Storage


def test_an_s3_store_reaches_another_bucket_of_its_service_with_its_own_connection() -> None:
    store = S3Storage("root-bucket", "jobs", endpoint_url="http://127.0.0.1:9", region_name="eu-west-1",
                      aws_access_key_id="AK", aws_secret_access_key="never-shown")
    moved = store.child("job").at("s3a://other-bucket/moved/sp-1")
    assert isinstance(moved, S3Storage)
    assert ((moved.uri, moved.bucket, moved.prefix)
            == ("s3://other-bucket/moved/sp-1", "other-bucket", "moved/sp-1/"))
    assert moved.connection.same_service(store.connection) and moved.endpoint_url == store.endpoint_url
    assert (store.uri, store.prefix) == ("s3://root-bucket/jobs", "jobs/")  # the store itself is unchanged
    for other in ("/mnt/savepoints/sp-1", "file:///mnt/sp-1", "memory://bucket/sp-1"):
        assert store.at(other) is None
    with pytest.raises(InvalidPath):
        store.at("s3://Not_A_Bucket/sp-1")


def test_a_callers_client_is_shared_and_an_owned_one_is_not() -> None:
    client = object()
    given = S3Storage("root-bucket", client=client)
    moved = given.at("s3://other-bucket/sp")
    assert isinstance(moved, S3Storage) and moved.connection._client is client
    assert moved.connection.same_service(given.connection)


def test_memory_and_local_stores_reach_their_own_kind_only(tmp_path: Path) -> None:
    bucket = uuid.uuid4().hex
    MemoryStorage(bucket).put("moved/sp/_metadata", b"m")
    moved = MemoryStorage("root").child("job").at(f"memory://{bucket}/moved/sp")
    assert moved is not None and moved.get("_metadata") == b"m"
    assert MemoryStorage("root").at(str(tmp_path)) is None

    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "_metadata").write_bytes(b"l")
    local = LocalStorage(str(tmp_path / "root")).at(f"file://{tmp_path}/sp")
    assert local is not None and local.get("_metadata") == b"l"
    assert LocalStorage(str(tmp_path)).at("s3://bucket/sp") is None
    assert LocalStorage(str(tmp_path)).at("memory://bucket/sp") is None
