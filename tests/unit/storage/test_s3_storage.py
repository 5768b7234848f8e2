"""What only the S3 store has: bucket rules, lazy paging, retries, error mapping, fallbacks.

The behaviour every store shares is in ``test_storage_contract.py``. Faults are injected
with botocore event hooks: a ``before-send`` handler that returns a response stops the
request from being sent and hands botocore that response instead.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage import s3 as s3_module
from airflow_sparkpoint.storage.s3 import S3Storage, validate_bucket_name
from tests.support.servers import free_port

SECRET = "wJalrXUtnFEMI-never-in-a-message"


@pytest.fixture()
def store(s3_server: str, s3_bucket: str) -> Iterator[S3Storage]:
    s = S3Storage(s3_bucket, "unit", endpoint_url=s3_server, region_name="us-east-1")
    yield s
    s.close()


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _response(status: int, body: str = "", code: str = "", message: str = "injected") -> AWSResponse:
    if code:
        body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message>"
        body += "</Error>"
    headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
    return AWSResponse("http://injected", status, headers, _Raw(body.encode()))


@contextmanager
def _hook(store: S3Storage, event: str, handler: Callable[..., Any]) -> Iterator[None]:
    events = store.client.meta.events
    events.register(event, handler)
    try:
        yield
    finally:
        events.unregister(event, handler)


def _counter(store: S3Storage, event: str) -> tuple[list[str], Callable[..., None]]:
    calls: list[str] = []

    def count(**kwargs: Any) -> None:
        calls.append(kwargs.get("event_name", event))

    return calls, count


# -- construction (no network) ------------------------------------------------------------


@pytest.mark.parametrize("name", ["abc", "my.bucket-1", "a" * 63, "sp-0123456789ab", "b1--x-s3"])
def test_valid_bucket_names(name: str) -> None:
    assert validate_bucket_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "ab", "a" * 64, "Upper", "under_score", "-start", "end-", "a..b", "a.-b", "a-.b", "192.168.1.10",
     "xn--bucket", "sthree-x", "bucket-s3alias", "bucket--ol-s3", "has space", "slash/bucket"],
)
def test_invalid_bucket_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidPath, match="S3 bucket name"):
        S3Storage(name)


def test_constructor_validates_its_arguments() -> None:
    for endpoint in ("localhost:9000", "ftp://host", "http://", ""):
        with pytest.raises(InvalidPath, match="endpoint_url"):
            S3Storage("bucket", endpoint_url=endpoint)
    for attempts in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_attempts"):
            S3Storage("bucket", max_attempts=attempts)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="addressing_style"):
        S3Storage("bucket", addressing_style="sideways")
    with pytest.raises(InvalidPath, match=r"'\.\./x'"):
        S3Storage("bucket", "../x")


def test_uri_repr_and_pickle_keep_no_secrets_and_no_client() -> None:
    store = S3Storage(
        "bucket", "/a/b/", endpoint_url="http://user:pw@127.0.0.1:9", aws_secret_access_key=SECRET
    )
    assert store.uri == "s3://bucket/a/b"
    assert S3Storage("bucket").uri == "s3://bucket"
    assert SECRET not in repr(store) and "pw" not in repr(store)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.uri == store.uri and copy.connection._client is None


# -- reachability and error mapping -------------------------------------------------------


@pytest.mark.s3
def test_check_passes_on_a_reachable_bucket(store: S3Storage) -> None:
    store.check()


@pytest.mark.s3
def test_wrong_bucket_is_a_clear_storage_error(s3_server: str) -> None:
    store = S3Storage("sp-no-such-bucket", "x", endpoint_url=s3_server, aws_secret_access_key=SECRET,
                      aws_access_key_id="testing")
    expected = f"bucket 'sp-no-such-bucket' does not exist or is not accessible at {s3_server}"
    calls: list[Callable[[], object]] = [
        store.check,
        lambda: store.get("k"),
        lambda: store.stat("k"),
        lambda: store.exists("k"),  # must not answer "no" for a bucket that is not there
        lambda: store.put("k", b"1"),
        lambda: store.put_if_absent("k", b"1"),
        lambda: list(store.list()),
        lambda: store.list_dirs(),
        lambda: store.copy("a", "b"),
        lambda: store.delete(["k"]),
    ]
    for call in calls:
        with pytest.raises(StorageError) as info:
            call()
        assert not isinstance(info.value, (ObjectNotFound, ObjectExists)), info.value
        assert expected in str(info.value)
        assert SECRET not in str(info.value)


@pytest.mark.s3
def test_unreachable_endpoint_fails_fast(s3_bucket: str) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Storage(s3_bucket, "p", endpoint_url=endpoint, max_attempts=1, connect_timeout=1,
                      read_timeout=1, aws_secret_access_key=SECRET, aws_access_key_id="testing")
    started = time.monotonic()
    for op, call in [
        ("HeadBucket", store.check),
        ("PutObject", lambda: store.put("k", b"1")),
        ("GetObject", lambda: store.get("k")),
        ("ListObjectsV2", lambda: list(store.list())),
    ]:
        with pytest.raises(StorageError) as info:
            call()
        message = str(info.value)
        assert not isinstance(info.value, ObjectNotFound)
        assert op in message and endpoint in message and "unreachable" in message
        assert f"s3://{s3_bucket}/p" in message
        assert SECRET not in message
    assert time.monotonic() - started < 10


@pytest.mark.s3
def test_endpoint_credentials_never_appear_in_messages(s3_bucket: str) -> None:
    endpoint = f"http://admin:hunter2@127.0.0.1:{free_port()}"
    store = S3Storage(s3_bucket, endpoint_url=endpoint, max_attempts=1)
    with pytest.raises(StorageError) as info:
        store.get("k")
    assert "hunter2" not in str(info.value) and "admin" not in str(info.value)


# -- lazy listing -------------------------------------------------------------------------


@pytest.mark.s3
def test_list_fetches_pages_lazily(store: S3Storage) -> None:
    """Paging with small pages (the contract suite covers the real 1,000-key pages)."""
    for i in range(5):
        store.put(f"lazy/{i}", b".")
    calls, count = _counter(store, "ListObjectsV2")

    def small_pages(params: dict[str, Any], **_: Any) -> None:
        params["MaxKeys"] = 2

    with _hook(store, "provide-client-params.s3.ListObjectsV2", small_pages), _hook(
        store, "before-call.s3.ListObjectsV2", count
    ):
        listing = store.list("lazy")
        assert calls == []  # nothing is sent before the first item is asked for
        assert [next(listing).key, next(listing).key] == ["lazy/0", "lazy/1"]
        assert len(calls) == 1
        assert next(listing).key == "lazy/2"
        assert len(calls) == 2
        assert [i.key for i in listing] == ["lazy/3", "lazy/4"]
        assert len(calls) == 3


@pytest.mark.parametrize("value", [
    "2026-11-27T08:53:39.000Z",  # AWS S3's listings
    "2026-11-27T08:53:39Z",  # SeaweedFS's
    "2026-11-27T08:53:39.123456+02:00",
    "2026-11-27T08:53:39",  # no zone: UTC, as botocore reads it
    "Fri, 27 Nov 2026 08:53:39 GMT",  # an HTTP date (HeadObject's Last-Modified)
    "1795769619",  # epoch seconds
    "2026-11-27 not a time T",  # neither: botocore's parser decides (and raises)
])
def test_the_stores_timestamp_parser_reads_what_botocores_reads(value: str) -> None:
    from botocore.utils import parse_timestamp as botocore_parse

    from airflow_sparkpoint.storage.s3_client import parse_timestamp

    try:
        expected = botocore_parse(value)
    except ValueError:
        with pytest.raises(ValueError):
            parse_timestamp(value)
        return
    got = parse_timestamp(value)
    assert got.timestamp() == expected.timestamp() and got.tzinfo is not None


@pytest.mark.s3
def test_listings_read_modification_times_with_the_stores_parser(store: S3Storage) -> None:
    """The store's client parses listing timestamps with `parse_timestamp` (botocore's
    own parser was most of the CPU of a checkpoint's listing), to the times HEAD reports."""
    from airflow_sparkpoint.storage import s3_client

    store.put("times/a", b"1")
    calls: list[Any] = []
    real = s3_client.parse_timestamp

    def counted(value: Any) -> Any:
        calls.append(value)
        return real(value)

    store.connection._client = None  # a new client, built with the wrapped parser
    original = s3_client.parse_timestamp
    s3_client.parse_timestamp = counted  # type: ignore[assignment]
    try:
        [listed] = list(store.list("times"))
    finally:
        s3_client.parse_timestamp = original  # type: ignore[assignment]
    assert calls and all(isinstance(c, str) for c in calls)
    assert abs(listed.mtime - store.stat("times/a").mtime) < 1.0


def _access_key(store: S3Storage) -> str:
    return str(store.client._request_signer._credentials.access_key)


def test_every_stores_client_reads_botocores_models_through_one_loader() -> None:
    """A loader of its own reads botocore's service models again (≈ 0.1 s for every store's
    first client, several per job start): the stores' sessions share one, and nothing else,
    so each client still signs with its own store's credentials."""
    endpoint = "http://127.0.0.1:9"
    a = S3Storage("bucket-a", endpoint_url=endpoint, aws_access_key_id="k1", aws_secret_access_key="s1")
    b = S3Storage("bucket-b", "p", endpoint_url=endpoint, aws_access_key_id="k2", aws_secret_access_key="s2")
    assert a.client is not b.client and a.client._loader is b.client._loader
    assert (_access_key(a), _access_key(b)) == ("k1", "k2")
    paths = a.client._loader.search_paths
    assert len(paths) == len(set(paths)), "boto3's data path is added to the shared loader at every session"


def test_credentials_are_resolved_again_for_every_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rotated credentials (the environment, a credentials file) reach the next store."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-1")
    assert _access_key(S3Storage("bucket-a", endpoint_url="http://127.0.0.1:9")) == "from-env-1"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env-2")
    assert _access_key(S3Storage("bucket-a", endpoint_url="http://127.0.0.1:9")) == "from-env-2"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for key in ("from-file-1", "from-file-2"):
        credentials.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = s\n")
        assert _access_key(S3Storage("bucket-a", endpoint_url="http://127.0.0.1:9")) == key


@pytest.mark.s3
def test_folder_markers_are_not_objects(store: S3Storage) -> None:
    store.client.put_object(Bucket=store.bucket, Key="unit/dir/", Body=b"")
    store.put("dir/real", b"1")
    assert [i.key for i in store.list()] == ["dir/real"]
    assert store.list_dirs() == ["dir"]


@pytest.mark.s3
def test_store_without_prefix_uses_the_bucket_root(s3_server: str, s3_bucket: str) -> None:
    root = S3Storage(s3_bucket, endpoint_url=s3_server)
    root.put("top", b"1")
    assert root.client.get_object(Bucket=s3_bucket, Key="top")["Body"].read() == b"1"
    assert [i.key for i in root.list()] == ["top"]
    root.close()


# -- retries and conditional-write outcomes ----------------------------------------------


@pytest.mark.s3
def test_5xx_is_retried_until_the_put_succeeds(store: S3Storage) -> None:
    attempts: list[int] = []

    def flaky(**_: Any) -> AWSResponse | None:
        attempts.append(1)
        if len(attempts) <= 2:
            return _response(503, code="ServiceUnavailable", message="Please reduce your request rate.")
        return None  # the third attempt goes to the server

    with _hook(store, "before-send.s3.PutObject", flaky):
        store.put("retried", b"payload")
    assert len(attempts) == 3
    assert store.get("retried") == b"payload"


@pytest.mark.s3
def test_retries_give_up_after_max_attempts(s3_server: str, s3_bucket: str) -> None:
    store = S3Storage(s3_bucket, endpoint_url=s3_server, max_attempts=2)
    attempts: list[int] = []

    def down(**_: Any) -> AWSResponse:
        attempts.append(1)
        return _response(500, code="InternalError", message="We encountered an internal error.")

    with _hook(store, "before-send.s3.PutObject", down), pytest.raises(StorageError) as info:
        store.put("never", b"1")
    assert len(attempts) == 2
    assert "InternalError" in str(info.value) and f"s3://{s3_bucket}/never" in str(info.value)
    assert not store.exists("never")


@pytest.mark.s3
def test_put_if_absent_retries_a_409_conflict(store: S3Storage) -> None:
    attempts: list[int] = []

    def conflict_once(**_: Any) -> AWSResponse | None:
        attempts.append(1)
        return _response(409, code="ConditionalRequestConflict") if len(attempts) == 1 else None

    with _hook(store, "before-send.s3.PutObject", conflict_once):
        store.put_if_absent("gen/7", b"mine")
    assert len(attempts) == 2
    assert store.get("gen/7") == b"mine"


@pytest.mark.s3
def test_put_if_absent_persistent_conflict_is_not_reported_as_exists(store: S3Storage) -> None:
    def always_conflict(**_: Any) -> AWSResponse:
        return _response(409, code="ConditionalRequestConflict")

    with _hook(store, "before-send.s3.PutObject", always_conflict), pytest.raises(StorageError) as info:
        store.put_if_absent("gen/8", b"mine")
    assert not isinstance(info.value, ObjectExists)
    assert "conflict" in str(info.value)


@pytest.mark.s3
def test_put_if_absent_whose_response_was_lost_still_wins(store: S3Storage) -> None:
    """The first attempt lands but its answer is lost (here: a 503 instead); botocore
    retries and S3 says 412. Same bytes at the key: it was this call that created it."""
    other = S3Storage(store.bucket, "unit", endpoint_url=store.endpoint_url)
    sent: list[int] = []

    def lose_answer(**_: Any) -> AWSResponse | None:
        sent.append(1)
        if len(sent) == 1:
            other.put_if_absent("gen/9", b"mine")  # what the server did with attempt 1
            return _response(503, code="ServiceUnavailable")
        return None

    with _hook(store, "before-send.s3.PutObject", lose_answer):
        store.put_if_absent("gen/9", b"mine")
    assert len(sent) == 2

    sent.clear()

    def someone_else_won(**_: Any) -> AWSResponse | None:
        sent.append(1)
        if len(sent) == 1:
            other.put_if_absent("gen/10", b"theirs")
            return _response(503, code="ServiceUnavailable")
        return None

    with _hook(store, "before-send.s3.PutObject", someone_else_won), pytest.raises(ObjectExists):
        store.put_if_absent("gen/10", b"mine")
    assert store.get("gen/10") == b"theirs"
    other.close()


@pytest.mark.s3
def test_put_if_absent_timeout_says_the_outcome_is_unknown(s3_server: str, s3_bucket: str) -> None:
    from botocore.exceptions import ReadTimeoutError

    store = S3Storage(s3_bucket, endpoint_url=s3_server, max_attempts=1)

    def time_out(**_: Any) -> None:
        raise ReadTimeoutError(endpoint_url=s3_server)

    with _hook(store, "before-send.s3.PutObject", time_out), pytest.raises(StorageError) as info:
        store.put_if_absent("gen/11", b"mine")
    assert not isinstance(info.value, ObjectExists)
    assert "may or may not have been created" in str(info.value)
    store.close()


# -- delete and copy ----------------------------------------------------------------------


@pytest.mark.s3
def test_per_key_delete_errors_are_reported(store: S3Storage) -> None:
    store.put("a", b"1")
    result = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Error><Key>unit/a</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        "</DeleteResult>"
    )

    def partial_failure(**_: Any) -> AWSResponse:
        return _response(200, body=result)

    with _hook(store, "before-send.s3.DeleteObjects", partial_failure), pytest.raises(StorageError) as info:
        store.delete(["a", "b"])
    message = str(info.value)
    assert f"s3://{store.bucket}/unit/a: AccessDenied" in message and "1 key(s)" in message


@pytest.mark.s3
def test_copy_above_the_single_request_limit_uses_multipart(store: S3Storage) -> None:
    data = os.urandom(11 * 1024 * 1024)
    store.put("big/src", data)
    store._max_copy_object_size = 1024 * 1024  # stands in for the real 5 GiB limit
    store._copy_chunksize = 5 * 1024 * 1024
    parts, count = _counter(store, "UploadPartCopy")

    def too_large(**_: Any) -> AWSResponse:
        return _response(
            400, code="InvalidRequest",
            message="The specified copy source is larger than the maximum allowable size for a copy source",
        )

    with _hook(store, "before-send.s3.CopyObject", too_large), _hook(
        store, "before-call.s3.UploadPartCopy", count
    ):
        store.copy("big/src", "big/dst")
    assert len(parts) == 3
    assert store.get("big/dst") == data


@pytest.mark.s3
def test_copy_refused_for_another_reason_is_not_retried_as_multipart(store: S3Storage) -> None:
    store.put("small", b"1")

    def refuse(**_: Any) -> AWSResponse:
        return _response(400, code="InvalidRequest", message="This copy request is illegal")

    with _hook(store, "before-send.s3.CopyObject", refuse), pytest.raises(StorageError, match="illegal"):
        store.copy("small", "dst")
    assert not store.exists("dst")


# -- client lifecycle and files -----------------------------------------------------------


@pytest.mark.s3
def test_close_and_reuse_and_shared_clients(store: S3Storage, s3_server: str) -> None:
    store.put("k", b"1")
    store.close()
    assert store.connection._client is None
    assert store.get("k") == b"1"  # a new client on demand
    shared = S3Storage(store.bucket, "unit", client=store.client)
    shared.close()  # not its client: left open
    assert store.client is shared.client
    assert store.get("k") == b"1"
    revived = pickle.loads(pickle.dumps(store))
    assert revived.get("k") == b"1"
    revived.close()


@pytest.mark.s3
def test_upload_of_a_missing_local_file(store: S3Storage, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match="nope.bin"):
        store.upload_file(str(tmp_path / "nope.bin"), "k")
    assert not store.exists("k")


@pytest.mark.s3
def test_conditional_writes_are_probed_once_and_leave_nothing(
    store: S3Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "_EXCLUSIVE_CREATE_OK", set())
    calls, count = _counter(store, "before-send.s3.PutObject")
    with _hook(store, "before-send.s3.PutObject", count):
        store.check_exclusive_create()
        store.check_exclusive_create()
    assert len(calls) == 2, "probed once: a create, then a refused second create"
    assert list(store.list("_sparkpoint_probe/")) == []


@pytest.mark.s3
def test_an_endpoint_that_ignores_if_none_match_is_refused(
    store: S3Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3-compatible server that ignores the header (simulated by dropping it from the
    request) would let two drivers both claim one generation or batch."""
    monkeypatch.setattr(s3_module, "_EXCLUSIVE_CREATE_OK", set())
    dropped: list[str] = []

    def drop(request: Any, **_: Any) -> None:
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]
            dropped.append(request.url)

    with _hook(store, "before-sign.s3.PutObject", drop), \
            pytest.raises(StorageError, match=r"does not honour conditional writes.*If-None-Match") as info:
        store.check_exclusive_create()
    assert len(dropped) == 2, "the fault (the header dropped) was injected on both probe writes"
    assert store.endpoint_url is not None and store.endpoint_url.split("//")[1] in str(info.value)
    assert list(store.list("_sparkpoint_probe/")) == []


@pytest.mark.s3
def test_copy_from_another_bucket_of_the_service_is_server_side(store: S3Storage, s3_server: str) -> None:
    """A savepoint's object copied into a job's shared area in another bucket of the same
    service: one CopyObject, no byte through this process."""
    import boto3

    other_bucket = f"sp-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=other_bucket)
    source = S3Storage(other_bucket, "savepoints/sp-1", endpoint_url=s3_server, region_name="us-east-1")
    data = os.urandom(300_000)
    source.put("state/0/0/1.zip", data)
    copies, count_copies = _counter(store, "CopyObject")
    reads, count_reads = _counter(source, "GetObject")
    with _hook(store, "before-call.s3.CopyObject",
               count_copies), _hook(source, "before-call.s3.GetObject", count_reads):
        assert store.copy_from(source.child("state"), "0/0/1.zip", "shared/1.zip~ab") is True
    assert store.get("shared/1.zip~ab") == data
    assert len(copies) == 1 and reads == []
    with pytest.raises(ObjectNotFound, match=other_bucket):
        store.copy_from(source, "state/0/0/2.zip", "shared/2.zip~cd")
    source.close()


@pytest.mark.s3
def test_copy_from_another_service_or_identity_is_declined(
    store: S3Storage, s3_server: str, tmp_path: Path
) -> None:
    """Another endpoint, other credentials or another kind of store: nothing is written and
    the caller moves the bytes itself."""
    from airflow_sparkpoint.storage import LocalStorage, MemoryStorage

    other_identity = S3Storage(store.bucket, "unit", endpoint_url=s3_server, region_name="us-east-1",
                               aws_access_key_id="someone-else", aws_secret_access_key="other")
    other_endpoint = S3Storage(store.bucket, "unit", endpoint_url=s3_server.replace("127.0.0.1", "localhost"),
                               region_name="us-east-1")
    local = LocalStorage(str(tmp_path))
    local.put("k", b"1")
    memory = MemoryStorage(uuid.uuid4().hex)
    memory.put("k", b"1")
    for source in (other_identity, other_endpoint, local, memory):
        assert store.copy_from(source, "k", "dst") is False
    assert not store.exists("dst")


class _CutBody:
    """A GetObject body that breaks after `after` bytes, as a dropped connection does."""

    def __init__(self, body: Any, after: int) -> None:
        self._body = body
        self._after = after

    def iter_chunks(self, chunk_size: int) -> Iterator[bytes]:
        from botocore.exceptions import ResponseStreamingError

        yield self._body.read(self._after)
        raise ResponseStreamingError(error="connection reset by peer (injected)")

    def close(self) -> None:
        self._body.close()


@pytest.mark.s3
@pytest.mark.parametrize("attempts", [3, 1])
def test_a_download_cut_short_is_read_again_or_fails_leaving_nothing(
    s3_server: str, s3_bucket: str, tmp_path: Path, attempts: int
) -> None:
    store = S3Storage(s3_bucket, "unit", endpoint_url=s3_server, region_name="us-east-1",
                      max_attempts=attempts)
    data = os.urandom(3 * 1024 * 1024 + 17)
    store.put("state/1.zip", data)
    cut: list[int] = []

    def cut_first(parsed: dict[str, Any], **_: Any) -> None:
        if not cut:
            cut.append(1)
            parsed["Body"] = _CutBody(parsed["Body"], 1024 * 1024)

    target = tmp_path / "live" / "state" / "1.zip"
    with _hook(store, "after-call.s3.GetObject", cut_first):
        if attempts == 1:
            with pytest.raises(StorageError, match="connection reset"):
                store.download_file("state/1.zip", str(target))
        else:
            store.download_file("state/1.zip", str(target))
    assert cut == [1], "the injected cut did not happen"
    if attempts == 1:
        assert not target.exists()
    else:
        assert target.read_bytes() == data
    assert [p.name for p in target.parent.iterdir()] == (["1.zip"] if attempts > 1 else [])
    store.close()


@pytest.mark.s3
def test_small_objects_download_with_one_get_large_ones_with_ranged_parts(
    store: S3Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(2 * 1024 * 1024)
    store.put("blob", data)
    sent, count = _counter(store, "any")
    with _hook(store, "before-call.s3", count):
        store.download_file("blob", str(tmp_path / "one"))
    assert sent == ["before-call.s3.GetObject"]
    monkeypatch.setattr(s3_module, "_SINGLE_REQUEST_MAX", 1024 * 1024)  # stands in for 64 MiB
    sent.clear()
    with _hook(store, "before-call.s3", count):
        store.download_file("blob", str(tmp_path / "managed"))
    assert "before-call.s3.HeadObject" in sent and sent.count("before-call.s3.GetObject") >= 2
    assert (tmp_path / "one").read_bytes() == data == (tmp_path / "managed").read_bytes()


@pytest.mark.s3
def test_small_files_upload_with_one_put_and_no_thread_large_ones_in_parts(
    store: S3Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(2 * 1024 * 1024)
    src = tmp_path / "blob"
    src.write_bytes(data)
    started: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    sent, count = _counter(store, "any")
    with _hook(store, "before-call.s3", count):
        store.upload_file(str(src), "one")
    assert sent == ["before-call.s3.PutObject"]
    # a managed transfer starts a thread pool per file (the in-process moto server starts
    # one thread per request: not ours)
    assert [name for name in started if "process_request" not in name] == []
    monkeypatch.setattr(s3_module, "_SINGLE_REQUEST_MAX", 1024 * 1024)  # stands in for 64 MiB
    sent.clear()
    with _hook(store, "before-call.s3", count):
        store.upload_file(str(src), "managed")
    # s3transfer raises the part size to S3's 5 MiB minimum: one part here
    assert (sent == [f"before-call.s3.{op}"
                     for op in ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")])
    assert store.get("one") == data == store.get("managed")


@pytest.mark.s3
def test_an_upload_cut_off_mid_file_is_retried_from_the_first_byte(store: S3Storage, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    src = tmp_path / "blob"
    src.write_bytes(data)
    attempts: list[int] = []

    def torn(request: Any, **_: Any) -> AWSResponse | None:
        attempts.append(1)
        if len(attempts) == 1:
            request.body.read(100_000)  # part of the file went out before the connection broke
            return _response(500, code="InternalError", message="We encountered an internal error.")
        return None

    with _hook(store, "before-send.s3.PutObject", torn):
        store.upload_file(str(src), "retried")
    assert len(attempts) == 2
    assert store.get("retried") == data


@pytest.mark.s3
def test_a_file_that_grows_during_its_upload_stores_the_bytes_it_had_when_opened(
    store: S3Storage, tmp_path: Path
) -> None:
    first, more = os.urandom(50_000), os.urandom(30_000)
    src = tmp_path / "000008.sst"
    src.write_bytes(first)

    def grow(**_: Any) -> None:  # the request is built; Spark goes on writing the file
        with src.open("ab") as handle:
            handle.write(more)

    with _hook(store, "before-send.s3.PutObject", grow):
        store.upload_file(str(src), "grown")
    assert store.get("grown") == first
    # The connection the PUT used is still in step: the next requests on it work.
    store.put("after", b"next")
    assert store.get("after") == b"next" and store.get("grown") == first

