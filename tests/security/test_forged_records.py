"""Trust nothing read from storage (issue #28): whoever can write the checkpoint store or
a sink's output location cannot make Sparkpoint delete, move or write anything outside
the job's own places, nor exhaust its memory.

Every test forges what an attacker with write access to one location could plant, keeps
a victim outside every root, and checks that it survives (or that a planted file did not
move). The commit step's sink comes from its caller, never from a record; an undeclared
sink is rebuilt from the record but every path it names is confined under its root.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, TransactionRecord
from airflow_sparkpoint.checkpoints.metadata import canonical_json, sha256_hex
from airflow_sparkpoint.exceptions import InvalidPath, SinkError, SparkpointError
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.storage import LocalStorage, open_storage
from tests.support.forgery import JOB, assert_refused, forged_record, outcome, s3_objects
from tests.support.records import checkpoint_at, job_status
from tests.support.sink_files import sink_dir, staged_transaction


def victim_dir(root: Path) -> Path:
    victim = root / "victim"
    victim.mkdir(parents=True)
    (victim / "precious.txt").write_text("must survive")
    return victim


def assert_survived(victim: Path) -> None:
    assert (victim / "precious.txt").read_text() == "must survive", f"{victim} was touched"


# ------------------------------------------------------------------- 1. a forged transaction record


def test_forged_record_cannot_make_the_commit_step_delete_a_directory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = victim_dir(tmp_path)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    # The record names the victim's parent as the sink and the victim as its staging.
    catalog.put_transaction(forged_record(1, 1, {"uri": str(tmp_path), "format": "json"},
                                          {"staging": "victim", "files": []}))
    with caplog.at_level(logging.WARNING):
        exc = outcome(commit_pending, catalog)  # no sink declared: rebuilt from the record, confined
    assert_survived(victim)
    assert_refused(exc, SparkpointError, "victim")
    assert any("declare" in r.getMessage() for r in caplog.records), "no warning recommends a declared sink"


def test_forged_record_for_another_sink_is_refused_by_a_declared_sink(tmp_path: Path) -> None:
    victim = victim_dir(tmp_path)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(forged_record(1, 1, {"uri": str(tmp_path), "format": "json"},
                                          {"staging": "victim", "files": []}))
    declared = DirectorySink(str(tmp_path / "out"), "json")
    exc = outcome(commit_pending, catalog, sink=declared)
    assert_survived(victim)
    assert_refused(exc, SinkError, "does not match")


def s3_forged_staging_root(endpoint: str, bucket: str, tmp_path: Path) -> None:
    options = {"endpoint_url": endpoint, "region_name": "us-east-1",
               "aws_access_key_id": "test", "aws_secret_access_key": "test"}
    store = open_storage(f"s3://{bucket}", **options)
    store.put("victims/precious.txt", b"must survive")
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(forged_record(1, 1, {"uri": f"s3://{bucket}", "format": "json"},
                                          {"staging": "/", "files": []}))
    exc = outcome(commit_pending, catalog, storage_options=options)
    assert "victims/precious.txt" in s3_objects(endpoint, bucket), "the forged staging '/' emptied the bucket"
    assert_refused(exc, SparkpointError, "staging")


@pytest.mark.s3
def test_forged_staging_root_cannot_empty_a_bucket_moto(
    s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    s3_forged_staging_root(s3_server, s3_bucket, tmp_path)


@pytest.mark.s3
def test_forged_staging_root_cannot_empty_a_bucket_seaweedfs(seaweedfs_server: str, tmp_path: Path) -> None:
    import boto3

    bucket = f"sp-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=seaweedfs_server, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=bucket)
    s3_forged_staging_root(seaweedfs_server, bucket, tmp_path)


# ------------------------------------------------------------------ 2. the job's own sink, a climbing staging


def test_own_sink_abort_of_a_climbing_staging_deletes_nothing_outside(tmp_path: Path) -> None:
    victim = victim_dir(tmp_path)
    sink = DirectorySink(str(tmp_path / "out"), "json")
    record = forged_record(1, 1, sink.to_config(), {"staging": "../victim", "files": []})
    exc = outcome(sink.abort, record)
    assert_survived(victim)
    assert_refused(exc, (SinkError, InvalidPath), "victim")


# ---------------------------------------------------------------- 3./4. claims planted in the output location


def plant_claim(sink: DirectorySink, record: TransactionRecord, state: str, plan: dict[str, Any]) -> None:
    claim = sink_dir(sink) / "_sparkpoint" / "manifests" / JOB / f"{record.batch_id}.json"
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(json.dumps({"state": state, "job": JOB, "batch_id": record.batch_id,
                                 "generation": record.generation, "txn_id": record.txn_id,
                                 "files": [], "plan": plan}))


def test_planted_done_claim_cannot_delete_outside_on_the_next_commit(tmp_path: Path) -> None:
    victim = victim_dir(tmp_path)
    sink = DirectorySink(str(tmp_path / "out"), "json")
    record = staged_transaction(sink, 4, 1, job=JOB)
    plant_claim(sink, record, "done", {"staging": "../victim", "moves": []})
    exc = outcome(sink.commit, record)
    assert_survived(victim)
    assert_refused(exc, (SinkError, InvalidPath), "victim")


def test_planted_promoting_claim_cannot_move_a_file_out(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    planted = tmp_path / "attacker" / "evil.py"
    planted.parent.mkdir()
    planted.write_text("import os  # runs in the DAG processor\n")
    sink = DirectorySink(str(tmp_path / "out"), "json")
    record = staged_transaction(sink, 5, 1, job=JOB)
    plant_claim(sink, record, "promoting", {
        "staging": f"_staging/{record.txn_id}",
        "moves": [["../attacker/evil.py", "../dags/evil.py", planted.stat().st_size]]})
    exc = outcome(sink.commit, record)
    assert planted.exists(), "the planted file was moved"
    assert not (dags / "evil.py").exists(), "a file was moved into the DAGs folder"
    assert_refused(exc, (SinkError, InvalidPath), "evil")


# ------------------------------------------------------------------- 5. replay records


def replay_record(body: dict[str, Any]) -> str:
    return "1:" + base64.b64encode(zlib.compress(json.dumps(body).encode(), 9)).decode()


def test_replay_sources_cannot_write_outside_the_live_location(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime import replay

    live = tmp_path / "live"
    live.mkdir()
    body = replay.decode(replay_record({
        "v": replay.SCHEMA_VERSION, "batch": 2, "offsets": "v1\n{}",
        "sources": {"../../escaped": {"entries": {"0": ["x"]}, "compact": []}}}))
    assert isinstance(body, dict), body
    exc = outcome(replay.write_batch, str(live), body)
    assert not (tmp_path / "escaped").exists(), "a replay record wrote outside the live location"
    assert_refused(exc, (SparkpointError, InvalidPath), "escaped")


def test_replay_record_decompression_is_bounded() -> None:
    from airflow_sparkpoint.runtime import replay

    bomb = replay_record({"v": replay.SCHEMA_VERSION, "batch": 2, "offsets": "v1\n{}",
                          "pad": "0" * (64 * 1024 * 1024)})
    assert len(bomb) < 1024 * 1024, "the bomb should be small compressed"
    outcome = replay.decode(bomb)
    assert isinstance(outcome, str) and "limit" in outcome, \
        f"a decompression bomb was accepted: {str(outcome)[:80]}"


# ------------------------------------------------------------------- 6. symlinks among the checkpoints


def test_a_symlinked_checkpoint_is_not_followed_by_dispose(tmp_path: Path) -> None:
    victim = victim_dir(tmp_path)
    store = LocalStorage(str(tmp_path / "store"))
    catalog = Catalog(store, JOB)
    checkpoint_at(catalog, 1)
    (tmp_path / "store" / JOB / "chk-9").symlink_to(victim, target_is_directory=True)
    try:
        catalog.dispose("chk-9")
    except SparkpointError:
        pass  # refusing is as good as deleting only the link
    assert_survived(victim)


def test_local_store_reads_and_deletes_no_symlink(tmp_path: Path) -> None:
    victim = victim_dir(tmp_path)
    root = tmp_path / "store"
    (root / JOB).mkdir(parents=True)
    (root / JOB / "status.json").symlink_to(victim / "precious.txt")
    (root / JOB / "chk-3").symlink_to(victim, target_is_directory=True)
    store = LocalStorage(str(root))
    assert [i.key for i in store.list(f"{JOB}/chk-3")] == [], "listing followed a linked directory"
    with pytest.raises(SparkpointError):
        store.get(f"{JOB}/status.json")
    with pytest.raises(SparkpointError):
        store.get(f"{JOB}/chk-3/precious.txt")
    try:
        store.delete([f"{JOB}/chk-3/precious.txt"])
    except SparkpointError:
        pass
    assert_survived(victim)


# ------------------------------------------------------------------- bounded reads, corrupt metadata


def test_a_huge_object_is_refused_as_corrupt(tmp_path: Path) -> None:
    from airflow_sparkpoint.storage.base import ObjectTooLarge

    store = LocalStorage(str(tmp_path / "store"))
    store.put(f"{JOB}/status.json", b" " * (2 * 1024 * 1024))
    with pytest.raises(ObjectTooLarge, match="status.json"):
        store.get(f"{JOB}/status.json", max_bytes=1024 * 1024)


def test_a_planted_huge_status_is_an_unreadable_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_sparkpoint.checkpoints.layout import RECORD_MAX_BYTES, STATUS

    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    (tmp_path / "store" / JOB).mkdir(parents=True)
    with open(tmp_path / "store" / JOB / STATUS, "wb") as handle:  # sparse: no disk used
        handle.truncate(RECORD_MAX_BYTES[STATUS] * 1024)
    with caplog.at_level(logging.WARNING):
        assert catalog.read_status() is None
    assert any("status.json" in r.getMessage() and "limit" in r.getMessage() for r in caplog.records)


@pytest.mark.s3
def test_s3_get_refuses_an_object_over_its_limit(s3_server: str, s3_bucket: str) -> None:
    from airflow_sparkpoint.storage.base import ObjectTooLarge

    store = open_storage(f"s3://{s3_bucket}/sp", endpoint_url=s3_server, region_name="us-east-1",
                         aws_access_key_id="test", aws_secret_access_key="test")
    store.put(f"{JOB}/status.json", b"{" + b" " * 4096 + b"}")
    with pytest.raises(ObjectTooLarge, match="status.json"):
        store.get(f"{JOB}/status.json", max_bytes=1024)
    assert store.get(f"{JOB}/status.json", max_bytes=8192).startswith(b"{")


def metadata_bytes(body: dict[str, Any]) -> bytes:
    body = dict(body)
    body["checksum"] = "sha256:" + sha256_hex(canonical_json(body))
    return json.dumps(body).encode()


@pytest.mark.parametrize("field,value", [("id", float("inf")), ("batch_id", float("inf")),
                                         ("created_at", float("nan")), ("generation", [1])])
def test_a_metadata_that_overflows_is_skipped_not_raised(tmp_path: Path, field: str, value: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 1)
    good = catalog.latest()
    assert good is not None
    body = json.loads(catalog.store.get(f"chk-{good.id}/_metadata"))
    body.pop("checksum")
    body["id"] = good.id + 1
    body[field] = value
    catalog.store.put(f"chk-{good.id + 1}/_metadata", metadata_bytes(body))
    with caplog.at_level(logging.WARNING):
        latest = catalog.latest()
    assert latest is not None and latest.id == good.id
    assert any(f"chk-{good.id + 1}" in r.getMessage() for r in caplog.records), "no warning names the path"


def test_materialisation_links_in_no_symlink_from_the_previous_live_location(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.materialize import _link
    from airflow_sparkpoint.storage.localfs import Dir

    victim = victim_dir(tmp_path) / "precious.txt"
    previous = tmp_path / "live-g1" / "state"
    previous.mkdir(parents=True)
    (previous / "1.delta").symlink_to(victim)
    st = victim.stat()
    target = tmp_path / "live-g2" / "state" / "1.delta"
    with Dir.open(str(tmp_path / "live-g1")) as old, Dir.open(str(tmp_path / "live-g2"), create=True) as new:
        assert not _link(old, new, "state/1.delta", st.st_size, st.st_mtime_ns), \
            "a symbolic link planted in the previous live location was linked into the new one"
    assert not target.exists()


def test_restore_time_recovery_leaves_a_record_for_another_sink_alone(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.recovery import settle_unconfirmed
    from airflow_sparkpoint.runtime.restore import RestorePlan

    victim = victim_dir(tmp_path)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    own = DirectorySink(str(tmp_path / "out"), "json")
    planted = (tmp_path / "out" / "_staging" / "x")
    planted.mkdir(parents=True)
    (planted / "kept.json").write_text("{}")  # what a record for another sink must not reach either
    catalog.put_transaction(forged_record(1, 1, {"uri": str(tmp_path), "format": "json"},
                                          {"staging": "_staging/x", "files": []}))
    summary = settle_unconfirmed(catalog, own, RestorePlan(snapshot=None, description="empty"))
    assert_survived(victim)
    assert (planted / "kept.json").exists(), "the job's sink acted on a record written for another sink"
    assert summary["aborted"] == []
    assert [r.txn_id for r in catalog.transactions()] == [f"{JOB}-b1-g1"], "the foreign record was deleted"


def test_cli_commit_with_a_declared_sink_refuses_a_forged_record(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_sparkpoint.cli import main

    victim = victim_dir(tmp_path)
    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 3)
    catalog.put_transaction(forged_record(1, 1, {"uri": str(tmp_path), "format": "json"},
                                          {"staging": "_staging/x", "files": []}))
    code = main(["commit", "--dir", str(tmp_path / "store"), "--job", JOB,
                 "--sink", f"directory:{tmp_path / 'out'}", "--sink-option", "format=json"])
    assert_survived(victim)
    assert code == 1 and "does not match the declared sink" in capsys.readouterr().err


def test_a_forged_live_dir_outside_the_work_root_is_never_used(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.restore import RestorePlan, choose_live

    victim = victim_dir(tmp_path)
    work = tmp_path / "work"
    choice = choose_live(RestorePlan(snapshot=None, description="empty"), [str(victim), f"file://{victim}"],
                         job_status("failed", job=JOB, heartbeat_at=0.0, live_dir=str(victim)),
                         work_root=str(work), job=JOB, generation=2, jvm_pid=None)
    try:
        assert choice.path == str(work / "g2")
        assert choice.link_from is None, f"a live_dir read from the store was used: {choice.link_from}"
    finally:
        choice.lock.release()
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]


@pytest.mark.parametrize("savepoint", ["/etc", "s3://another-bucket/orders/savepoints/savepoint-3-ab12cd34",
                                       "chk-3", "savepoints/../../other/savepoints/savepoint-3-ab12cd34"])
def test_a_control_result_naming_a_path_outside_the_jobs_savepoints_is_refused(tmp_path: Path,
                                                                                savepoint: str) -> None:
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.exceptions import ControlError

    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 1)
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", generation=1, timeout_s=60)
    catalog.store.put(f"control/{request.id}.result.json", json.dumps({
        "schema_version": 1, "request_id": request.id, "state": "completed", "generation": 1,
        "savepoint": savepoint, "batch_id": 1, "error": None, "updated_at": time.time()}).encode())
    with pytest.raises(ControlError, match="savepoint"):
        channel.result(request.id)
    good = f"{catalog.uri}/savepoints/savepoint-3-ab12cd34"
    catalog.store.put(f"control/{request.id}.result.json", json.dumps({
        "schema_version": 1, "request_id": request.id, "state": "completed", "generation": 1,
        "savepoint": good, "batch_id": 1, "error": None, "updated_at": time.time()}).encode())
    assert channel.result(request.id).savepoint == good


@pytest.mark.s3
def test_planted_done_claim_cannot_empty_an_s3_output_location(s3_server: str, s3_bucket: str) -> None:
    options = {"endpoint_url": s3_server, "region_name": "us-east-1",
               "aws_access_key_id": "test", "aws_secret_access_key": "test"}
    open_storage(f"s3://{s3_bucket}", **options).put("victims/precious.txt", b"must survive")
    sink = DirectorySink(f"s3://{s3_bucket}/out", "json")
    sink.configure(options)
    record = forged_record(4, 1, sink.to_config(), {"format": "json", "staging": f"_staging/{JOB}-b4-g1",
                                                     "files": [], "bytes": 0})
    store = open_storage(f"s3://{s3_bucket}/out", **options)
    store.put(f"_sparkpoint/manifests/{JOB}/4.json", json.dumps({
        "state": "done", "job": JOB, "batch_id": 4, "generation": 1, "txn_id": record.txn_id, "files": [],
        "plan": {"staging": "/", "moves": []}}).encode())
    store.put("part-committed-00000.json", b'{"id": 1}\n')  # output of an earlier batch
    exc = outcome(sink.commit, record)
    objects = s3_objects(s3_server, s3_bucket)
    assert "victims/precious.txt" in objects, "a planted claim emptied the bucket"
    assert "out/part-committed-00000.json" in objects, "a planted claim deleted committed output"
    assert_refused(exc, SinkError, "staging")


@pytest.mark.parametrize("savepoint", ["/etc", "s3://another-bucket/orders/savepoints/savepoint-3-ab12cd34",
                                       "chk-3", "savepoints/../../other/savepoints/savepoint-3-ab12cd34", 7])
def test_a_run_result_naming_a_path_outside_the_jobs_savepoints_loses_that_field(
        tmp_path: Path, savepoint: Any, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_sparkpoint.checkpoints.history import read_generation
    from airflow_sparkpoint.checkpoints.run_result import read_run_result, result_key

    catalog = Catalog(LocalStorage(str(tmp_path / "store")), JOB)
    checkpoint_at(catalog, 1)
    catalog.store.put(result_key(1), json.dumps({"status": "stopped", "job": JOB, "generation": 1,
                                                 "last_batch": 9, "savepoint": savepoint}).encode())
    with caplog.at_level(logging.WARNING):
        result = read_run_result(catalog, 1)
    assert result is not None and result.savepoint is None, f"a forged savepoint was kept: {result}"
    assert result.last_batch == 9, "the rest of the record was lost"
    assert any(result_key(1) in r.getMessage() and "savepoint" in r.getMessage() for r in caplog.records), \
        "the dropped savepoint was not reported"
    generation = read_generation(catalog, 1)
    assert generation.result is not None and generation.result.savepoint is None
    good = f"{catalog.uri}/savepoints/savepoint-3-ab12cd34"
    catalog.store.put(result_key(1), json.dumps({"status": "stopped", "job": JOB, "generation": 1,
                                                 "savepoint": good}).encode())
    assert (read_run_result(catalog, 1) or result).savepoint == good


def test_a_planted_done_claim_cannot_point_readers_outside_the_output(tmp_path: Path) -> None:
    victim_dir(tmp_path)
    sink = DirectorySink(str(tmp_path / "out"), "json")
    record = staged_transaction(sink, 7, 1, job=JOB)
    plant_claim(sink, record, "done", {"staging": f"_staging/{record.txn_id}", "moves": []})
    claim = tmp_path / "out" / "_sparkpoint" / "manifests" / JOB / "7.json"
    claim.write_text(json.dumps({**json.loads(claim.read_text()),
                                 "files": [{"path": "../victim/precious.txt"}]}))
    exc = outcome(sink.committed_files, JOB)
    assert_refused(exc, (SinkError, InvalidPath), "victim")
