"""Secrets stay secret, paths stay inside their job, and stored records are data only.

* S3 keys and connection passwords never appear in logs, the run result (XCom),
  checkpoint metadata, control records, transaction records, status, manifests, the
  Spark conf of a driver started by `SparkpointSubmitOperator`, its command line, nor in
  the repr/str/errors (tracebacks included) of the S3 storage and sinks.
* Control requests and restore or dispose paths that escape the job's prefix (``..``,
  other buckets, other jobs) are rejected before anything is touched; so is a
  ``_metadata`` whose file paths point outside the live location.
* ``_metadata``, transaction, control and manifest records are read as JSON only: a
  pickle payload is corrupt, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, FileRef
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest
from airflow_sparkpoint.exceptions import (
    ConfigError,
    ControlError,
    InvalidPath,
    RestoreError,
    SinkError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.storage import open_storage
from tests.support.records import put_checkpoint, transaction_record
from tests.support.servers import free_port
from tests.support.task_instances import FakeTI

HERE = Path(__file__).resolve().parent
JOB = "orders"
SECRET = f"sp-secret-{uuid.uuid4().hex}"
KEY_ID = f"AKIASP{uuid.uuid4().hex[:14].upper()}"
PASSWORD = f"pw-{uuid.uuid4().hex}"
SECRETS = (SECRET, PASSWORD)


def assert_clean(text: str, *, what: str, key_id: bool = True) -> None:
    for secret in (*SECRETS, *((KEY_ID,) if key_id else ())):
        assert secret not in text, \
            f"{what} shows a secret: ...{text[max(0, text.find(secret) - 200):][:400]}..."


def full_text(exc: BaseException) -> str:
    """Everything a log handler prints for `exc`: message, repr and the whole chain."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


class Detonator:
    """Unpickling this creates `marker`: proof that something called pickle.loads."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


# ---------------------------------------------------------------------------- S3 storage and sinks


@pytest.mark.s3
def test_s3_storage_repr_and_errors_hide_keys_and_endpoint_passwords(s3_server: str, s3_bucket: str) -> None:
    from airflow_sparkpoint.storage.s3 import S3Storage

    host = s3_server.split("://", 1)[1]
    store = S3Storage(s3_bucket, "root", endpoint_url=f"http://{KEY_ID}:{PASSWORD}@{host}",
                      region_name="us-east-1",
                      aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                      aws_session_token=SECRET + "-token")
    assert_clean(repr(store) + str(store) + repr(pickle.loads(pickle.dumps(store))), what="S3Storage repr")
    store.put("a", b"1")  # userinfo in the endpoint is not needed to reach it
    assert store.get("a") == b"1"

    failures: list[BaseException] = []
    missing = S3Storage(f"sp-missing-{uuid.uuid4().hex[:8]}",
                        endpoint_url=f"http://{KEY_ID}:{PASSWORD}@{host}",
                        aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET, max_attempts=1)
    unreachable = S3Storage(s3_bucket, endpoint_url=f"http://{KEY_ID}:{PASSWORD}@127.0.0.1:{free_port()}",
                            aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET, max_attempts=1,
                            connect_timeout=2)
    for action in (lambda: missing.check(), lambda: missing.get("k"), lambda: unreachable.get("k"),
                   lambda: unreachable.put_if_absent("k", b"x"), lambda: list(unreachable.list("")),
                   lambda: store.copy("no-such-key", "b")):
        with pytest.raises(StorageError) as info:
            action()
        failures.append(info.value)
    for exc in failures:
        assert_clean(full_text(exc), what=f"{type(exc).__name__} {exc}")


@pytest.mark.s3
def test_s3_and_directory_sinks_hide_credentials(s3_server: str, s3_bucket: str) -> None:
    from airflow_sparkpoint.sinks import DirectorySink, S3Sink

    host = s3_server.split("://", 1)[1]
    options = {"endpoint_url": f"http://{KEY_ID}:{PASSWORD}@{host}", "region_name": "us-east-1",
               "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}
    sinks = [S3Sink(f"s3://{s3_bucket}/out"), DirectorySink(f"s3://{s3_bucket}/dir")]
    for sink in sinks:
        sink.configure(options)
        shown = [repr(sink), str(sink), sink.sink_id, json.dumps(sink.to_config())]
        assert_clean("\n".join(shown), what=f"{type(sink).__name__} repr/config")
        sink.validate()

    # Errors: a destination that does not exist (connection errors: see the storage test;
    # the clients below never hold the endpoint's password, so botocore cannot quote it).
    missing = f"sp-missing-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    for sink in (S3Sink(f"s3://{missing}/x"), DirectorySink(f"s3://{missing}/y")):
        sink.configure(options)
        with pytest.raises(SparkpointError) as info:
            sink.validate()
        errors.append(info.value)
    record = transaction_record("s3", 0, 1,
                                {"uploads": [{"key": "x/part-orders-b0-g1-00000.json", "upload_id": "u",
                                              "parts": [[1, '"e"']], "size": 1, "rows": 1}]},
                                job=JOB, sink_id=f"s3://{missing}/x", config={"uri": f"s3://{missing}/x"})
    broken = S3Sink(f"s3://{missing}/x")
    broken.configure(options)
    for action in (lambda: broken.commit(record), lambda: broken.abort(record),
                   lambda: broken.cleanup_orphans(JOB, set())):
        with pytest.raises(SparkpointError) as info:
            action()
        errors.append(info.value)
    for exc in errors:
        assert_clean(full_text(exc), what=f"{type(exc).__name__} {exc}")

    from airflow_sparkpoint.sinks._s3_stage import executor_client

    for client in (sinks[0]._client, sinks[1]._storage().client, executor_client(s3_bucket, options)):  # type: ignore[attr-defined]
        assert_clean(str(client.meta.endpoint_url), what="a boto3 client's endpoint")


def test_executor_upload_spec_never_prints_its_options() -> None:
    from airflow_sparkpoint.sinks._s3_stage import UploadSpec

    spec = UploadSpec("b", "p/part-x-", "json", None,
                      {"aws_secret_access_key": SECRET, "aws_access_key_id": KEY_ID})
    assert_clean(repr(spec) + str(spec), what="UploadSpec")


# ---------------------------------------------------------------------------- a real run with secrets


@pytest.mark.spark
@pytest.mark.s3
def test_a_run_keeps_secrets_out_of_every_record_log_and_result(
    spark: Any, s3_server: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Credentials reach the driver through its environment, as the operator passes them."""
    import boto3

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import S3Sink
    from tests.support.inputs import write_id_events

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="airflow_sparkpoint")
    write_id_events(tmp_path / "input", files=2)
    root = f"s3://{s3_bucket}/root"
    catalog = Catalog.open(root, JOB, endpoint_url=s3_server, region_name="us-east-1")
    # A control request the job answers (it fails: there is no batch yet) leaves records too.
    ControlChannel(catalog).submit("savepoint", generation=catalog.current_generation() + 1, timeout_s=120,
                                   requested_by="security-test")

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": root, "spark.sparkpoint.job": JOB,
        "spark.sparkpoint.workDir": str(tmp_path / "work"), "spark.sparkpoint.s3.endpoint": s3_server,
        "spark.sparkpoint.s3.region": "us-east-1", "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.trigger": "availableNow", "spark.sparkpoint.control.pollInterval": "2s",
    }, argv=[])
    events = spark.readStream.schema("id long, user string, amount long").option("maxFilesPerTrigger", 1) \
        .json(str(tmp_path / "input"))
    result = job.run(events, sink=S3Sink(f"s3://{s3_bucket}/out", format="json"), output_mode="append")

    assert result.status == "finished" and result.last_batch == 1
    assert_clean(json.dumps(result.to_json()), what="the run result (XCom)")
    assert_clean(caplog.text, what="the driver's log")
    conf = json.dumps(sorted(spark.sparkContext.getConf().getAll())) + json.dumps(spark.conf.getAll)
    assert_clean(conf, what="the Spark conf")

    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    kinds: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket):
        for item in page.get("Contents", ()):
            body = client.get_object(Bucket=s3_bucket,
                                     Key=item["Key"])["Body"].read().decode("utf-8", "replace")
            assert_clean(body, what=f"s3://{s3_bucket}/{item['Key']}")
            kinds.update(k for k in ("_metadata", "/txn/", "/control/", "status.json", "/results/",
                                     "/manifests/", "/generations/") if k in item["Key"])
    # Every kind of record was written (and scanned); txn records are gone once committed.
    assert kinds >= {"_metadata", "/control/", "status.json", "/results/", "/manifests/", "/generations/"}, \
        kinds


@pytest.mark.airflow
@pytest.mark.spark
def test_submit_operator_passes_secrets_only_through_the_environment(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real spark-submit through `SparkpointSubmitOperator`: the driver sees the secret in
    its environment; its Spark conf, argv and command line, the task log, the XCom and the
    catalog never do."""
    from airflow_sparkpoint.operators import SparkpointSubmitOperator
    from tests.support.inputs import write_id_events
    from tests.support.submit import quiet_java_opts

    root = tmp_path / "sp"
    write_id_events(tmp_path / "input", files=1)
    monkeypatch.setenv("AIRFLOW_CONN_SP_SECURITY", json.dumps({
        "conn_type": "sparkpoint", "host": str(root), "login": KEY_ID, "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
    }))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    caplog.set_level(logging.INFO)
    dump = tmp_path / "dump.json"
    op = SparkpointSubmitOperator(
        task_id="submit", application=str(HERE / "jobs" / "conf_dump_job.py"), job_name=JOB,
        sparkpoint_conn_id="sp_security",
        application_args=["--input", str(tmp_path / "input"), "--output", str(tmp_path / "out"), "--dump",
                          str(dump)],
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1",
              "spark.driver.extraJavaOptions": quiet_java_opts(), "spark.pyspark.python": sys.executable},
    )
    result = op.execute({"ti": FakeTI()})  # type: ignore[arg-type]

    assert result is not None and result["status"] == "finished", caplog.text[-3000:]
    seen = json.loads(dump.read_text())
    assert seen["secret_sha256"] == hashlib.sha256(SECRET.encode()).hexdigest(), "the driver got no secret"
    assert_clean(json.dumps(seen["spark_conf"]) + json.dumps(seen["sql_conf"]),
                 what="the driver's Spark conf")
    assert_clean(json.dumps(seen["argv"]), what="the driver's argv")
    assert_clean(" ".join(op._hook._build_spark_submit_command(op.application)),  # type: ignore[union-attr]
                 what="the spark-submit command")
    assert_clean(json.dumps(op.conf) + json.dumps(op.env_vars or {}), what="the operator's conf and env_vars")
    assert_clean(json.dumps(result), what="the XCom")
    assert_clean(caplog.text, what="the task log")
    for path in root.rglob("*"):
        if path.is_file():
            assert_clean(path.read_text(errors="replace"), what=str(path))


# ---------------------------------------------------------------------------- JSON only, never pickle


def test_pickled_metadata_is_corrupt_and_never_unpickled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_sparkpoint.checkpoints.catalog import open_snapshot

    marker = tmp_path / "unpickled"
    catalog = Catalog(open_storage(str(tmp_path / "root")), JOB)
    good = put_checkpoint(catalog, batch_id=0, generation=1)
    bad = put_checkpoint(catalog, batch_id=1, generation=1)
    payload = pickle.dumps(Detonator(marker))
    catalog.store.put(f"chk-{bad.id}/_metadata", payload)
    savepoint = catalog.create_savepoint(catalog.handle(good))
    catalog.store.put(savepoint.uri.split(f"{JOB}/", 1)[1] + "/_metadata", payload)

    assert catalog.latest() == good
    assert f"chk-{bad.id}" in caplog.text and "not valid JSON" in caplog.text
    assert [e.valid for e in catalog.list_savepoints()] == [False]
    with pytest.raises(RestoreError, match="corrupt"):
        open_snapshot(savepoint.uri)
    with pytest.raises(RestoreError, match="corrupt"):
        open_snapshot(catalog.checkpoint_uri(bad.id))
    assert not marker.exists()


def test_pickled_records_are_skipped_or_refused_never_unpickled(tmp_path: Path) -> None:
    from airflow_sparkpoint.sinks import _manifests as manifests

    marker = tmp_path / "unpickled"
    payload = pickle.dumps(Detonator(marker))
    catalog = Catalog(open_storage(str(tmp_path / "root")), JOB)
    catalog.store.put("txn/000000000003-g000001.json", payload)
    assert catalog.transactions() == []

    request_id = "1700000000000-0123abcd"
    catalog.store.put(f"control/{request_id}.request.json", payload)
    channel = ControlChannel(catalog)
    assert channel.pending() == []
    with pytest.raises(ControlError, match="unreadable"):
        channel.result(request_id)
    catalog.store.put("status.json", payload)
    assert catalog.read_status() is None

    dest = open_storage(str(tmp_path / "dest"))
    dest.put(manifests.manifest_key(JOB, 0), payload)
    with pytest.raises(SinkError, match="unreadable"):
        manifests.read_manifest(dest, JOB, 0)
    assert not marker.exists()


# ---------------------------------------------------------------------------- paths stay inside the job


def test_metadata_file_paths_cannot_leave_the_live_location(tmp_path: Path) -> None:
    """A ``_metadata`` with a valid checksum (it is no MAC) naming ``../`` paths is corrupt:
    restoring it would write outside the live location, reading it would read outside the job."""
    from airflow_sparkpoint.runtime.restore import materialize

    catalog = Catalog(open_storage(str(tmp_path / "root")), JOB)
    good = put_checkpoint(catalog, batch_id=0, generation=1)
    ref = good.files[0]
    for evil in ({"path": "../../escaped"}, {"path": "/etc/escaped"}, {"key": "../other-job/shared/x"},
                 {"path": "offsets/../../escaped"}):
        forged = good.with_(id=catalog.next_checkpoint_id(), batch_id=good.batch_id + 1,
                            files=(FileRef(**{**ref.to_json(), **evil}),))
        catalog.complete_checkpoint(forged)
        assert catalog.latest() == good, evil
        assert "not a plain relative path" in (catalog.list_checkpoints()[0].error or "")
    materialize(catalog.handle(good), str(tmp_path / "work" / "live" / "g2"))
    assert sorted(p.name for p in tmp_path.rglob("escaped")) == []


def test_dispose_refuses_paths_outside_the_job(tmp_path: Path) -> None:
    root = tmp_path / "root"
    catalog = Catalog(open_storage(str(root)), JOB)
    other = Catalog(open_storage(str(root)), "other")
    mine, theirs = (put_checkpoint(catalog, batch_id=0, generation=1),
                    put_checkpoint(other, batch_id=0, generation=1))
    before = sorted(str(p) for p in root.rglob("*"))
    for path in (f"chk-{mine.id}/../../other/chk-{theirs.id}", f"{root}/other/chk-{theirs.id}",
                 f"file://{root}/{JOB}/../other/chk-{theirs.id}", f"s3://elsewhere/{JOB}/chk-{mine.id}",
                 "../other", "status.json", f"{root}/{JOB}"):
        with pytest.raises((InvalidPath, RestoreError)):
            catalog.dispose(path)
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_control_requests_cannot_escape_or_cross_jobs(tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path / "root")), JOB)
    channel = ControlChannel(catalog)
    for bad in ("../other/control/1700000000000-0123abcd", "1700000000000-0123abcd/../../x", "../../status",
                "1700000000000-0123ABCD", ""):
        with pytest.raises(ConfigError):
            channel.result(bad)
    # A request written into this job's channel but addressed to another job is never taken.
    foreign = ControlRequest(id="1700000000000-0123abcd", kind="stop", job="other", created_at=time.time(),
                             deadline=time.time() + 600)
    catalog.store.put(f"control/{foreign.id}.request.json", json.dumps(foreign.to_json()).encode())
    own = channel.submit("savepoint", generation=1, timeout_s=600)
    assert [r.id for r in channel.pending(1)] == [own.id]


def test_restore_targets_outside_the_job_are_refused_before_anything_is_touched(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.config import SparkpointConfig
    from airflow_sparkpoint.runtime.restore import plan_restore

    root = tmp_path / "root"
    catalog = Catalog(open_storage(str(root)), JOB)
    other = Catalog(open_storage(str(root)), "other")
    put_checkpoint(catalog, batch_id=0, generation=1)
    theirs = put_checkpoint(other, batch_id=0, generation=1)
    before = sorted(str(p) for p in root.rglob("*"))

    def plan(restore: str, **extra: str) -> Any:
        cfg = SparkpointConfig.from_conf({"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
                                          "spark.sparkpoint.restore": restore, **extra})
        return plan_restore(cfg, catalog, None)

    with pytest.raises(RestoreError, match="belongs to job 'other'"):
        plan(other.checkpoint_uri(theirs.id))
    with pytest.raises(RestoreError, match="belongs to job 'other'"):
        plan(f"{root}/{JOB}/../other/chk-{theirs.id}")
    with pytest.raises((InvalidPath, ConfigError)):
        plan(f"s3://some-bucket/root/{JOB}/../other/chk-{theirs.id}")
    with pytest.raises(RestoreError, match="no _metadata"):
        plan(str(tmp_path / "elsewhere"))
    assert sorted(str(p) for p in root.rglob("*")) == before
    assert catalog.current_generation() == 1  # nothing claimed a generation


# -------------------------------------------------------------------------- endpoint URLs and test_connection


def _sparkpoint_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "sparkpoint", **fields}))


@pytest.mark.airflow
def test_credentials_in_an_endpoint_url_are_refused_before_they_reach_the_spark_conf(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``user:password@`` in an endpoint URL (the connection's own, an ``aws`` connection's,
    or ``spark.sparkpoint.s3.endpoint`` set by hand) is refused with an error that names
    where it came from and quotes no secret: it would otherwise sit in the Spark conf,
    which the Spark UI shows to anyone who can open it."""
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.operators import SparkpointSubmitOperator
    from airflow_sparkpoint.runtime.config import SparkpointConfig

    endpoint = f"http://{KEY_ID}:{PASSWORD}@127.0.0.1:9"
    _sparkpoint_conn(monkeypatch, "sp_userinfo", host="s3://bucket/sp", login=KEY_ID, password=SECRET,
                     extra={"endpoint_url": endpoint})
    monkeypatch.setenv("AIRFLOW_CONN_AWS_USERINFO", json.dumps({
        "conn_type": "aws", "login": KEY_ID, "password": SECRET, "extra": {"endpoint_url": endpoint}}))
    _sparkpoint_conn(monkeypatch, "sp_aws_userinfo", host="s3://bucket/sp",
                     extra={"aws_conn_id": "aws_userinfo"})

    errors: list[BaseException] = []
    for conn_id in ("sp_userinfo", "sp_aws_userinfo"):
        with pytest.raises(ConfigError, match="credentials") as info:
            SparkpointHook(conn_id).storage_options  # noqa: B018 - resolving is the point
        assert conn_id in str(info.value) or "aws_userinfo" in str(info.value), str(info.value)
        errors.append(info.value)
        op = SparkpointSubmitOperator(task_id="submit", application="job.py", job_name=JOB,
                                      sparkpoint_conn_id=conn_id)
        with pytest.raises(ConfigError, match="credentials") as info:
            op.build_sparkpoint_conf("latest")
        errors.append(info.value)
    with pytest.raises(ConfigError, match="credentials") as info:
        SparkpointConfig.from_conf({"spark.sparkpoint.dir": "s3://bucket/sp", "spark.sparkpoint.job": JOB,
                                    "spark.sparkpoint.workDir": "/tmp/w",
                                    "spark.sparkpoint.s3.endpoint": endpoint})
    assert "spark.sparkpoint.s3.endpoint" in str(info.value)
    errors.append(info.value)
    for exc in errors:
        assert_clean(full_text(exc), what=f"{type(exc).__name__} {exc}")
        assert "127.0.0.1:9" in str(exc), \
            f"the error should name the endpoint (without its credentials): {exc}"


@pytest.mark.airflow
def test_test_connection_reports_failures_without_secrets(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The connection form's *Test* button shows the message to whoever clicks it: it says
    what failed, never a secret nor a credential-bearing URL, whatever the storage client's
    error quoted."""
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.storage.local import LocalStorage

    token = f"tok-{uuid.uuid4().hex}"
    # A storage root URI with credentials typed into it.
    _sparkpoint_conn(monkeypatch, "sp_bad_host", host=f"s3://{KEY_ID}:{SECRET}@bucket/sp")
    # A client error quoting its whole configuration (as some do).
    _sparkpoint_conn(monkeypatch, "sp_chatty", host=str(tmp_path / "sp"), login=KEY_ID, password=SECRET,
                     extra={"api_token": token, "region_name": "us-east-1"})

    def chatty(self: Any, prefix: str) -> list[str]:
        raise RuntimeError(f"cannot connect with key={KEY_ID} secret={SECRET} token={token} "
                           f"via http://{KEY_ID}:{PASSWORD}@proxy:3128")

    monkeypatch.setattr(LocalStorage, "list_dirs", chatty)
    for conn_id in ("sp_bad_host", "sp_chatty"):
        ok, message = SparkpointHook(conn_id).test_connection()
        assert ok is False, message
        assert_clean(message, what=f"test_connection of {conn_id}")
        assert token not in message and "@proxy" not in message, message
        assert conn_id in message, f"the message should name the connection: {message}"
    ok, message = SparkpointHook("sp_chatty").test_connection()
    assert "RuntimeError" in message and "proxy:3128" in message, message


def test_endpoint_url_check_accepts_plain_urls_and_refuses_any_userinfo_without_echoing_it() -> None:
    from airflow_sparkpoint.storage.endpoints import validate_endpoint_url

    for plain in ("http://minio:9000", " https://s3.example.com/base ", "http://127.0.0.1:9",
                  "http://[::1]:9000"):
        assert validate_endpoint_url(plain, "where") == plain.strip()
    for carrying in (f"http://{KEY_ID}:{PASSWORD}@minio:9000", f"http://{PASSWORD}@minio:9000",
                     f"https://:{PASSWORD}@minio", f"http://{KEY_ID}:{PASSWORD}@[bad:9000",
                     f"ftp://{KEY_ID}:{PASSWORD}@minio", f"http://{KEY_ID}:{PASSWORD}@minio:notaport"):
        with pytest.raises(ConfigError, match="^where=") as info:
            validate_endpoint_url(carrying, "where")
        assert_clean(full_text(info.value), what=f"the error for {carrying!r}")
    for bad in ("minio:9000", "http://", "http://mi nio:9000", ""):
        with pytest.raises(ConfigError, match="is not a URL"):
            validate_endpoint_url(bad, "where")
