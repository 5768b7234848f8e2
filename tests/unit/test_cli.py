"""The `sparkpoint` command, run in-process through `main([...])`: exit codes, human
output and the documented `--json` shapes (docs/CLI.md)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.storage import open_storage
from tests.support.cli_runs import checkpoint, job_with_checkpoints, run
from tests.support.fake_sinks import AbortRecordingSink
from tests.support.records import transaction_record, write_status

ENTRY_KEYS = {"kind", "id", "uri", "valid", "error", "batch_id", "generation", "created_at", "created",
              "duration_ms", "bytes_copied", "bytes_total", "file_count", "source_checkpoint",
              "status", "superseded_by", "state_partitions", "verified_at", "verify_error"}
SAVEPOINT_KEYS = {"job", "root", "kind", "source", "request_id", "state", "generation", "savepoint",
                  "batch_id"}


@pytest.fixture(autouse=True)
def _clean_env_and_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("SPARKPOINT_DIR", "SPARKPOINT_JOB", "SPARKPOINT_S3_ENDPOINT", "SPARKPOINT_S3_REGION"):
        monkeypatch.delenv(name, raising=False)
    logger = logging.getLogger("airflow_sparkpoint")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


# --------------------------------------------------------------------------- bad input


def test_missing_dir_and_job(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    code, _, err = run(capsys, "list", "--job", "orders")
    assert code == 2 and "--dir is required (or set SPARKPOINT_DIR)" in err
    code, _, err = run(capsys, "status", "--dir", str(root))
    assert code == 2 and "--job is required (or set SPARKPOINT_JOB)" in err


def test_environment_defaults(capsys: pytest.CaptureFixture[str], root: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    job_with_checkpoints(root, 1)
    monkeypatch.setenv("SPARKPOINT_DIR", str(root))
    monkeypatch.setenv("SPARKPOINT_JOB", "orders")
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0 and json.loads(out)["job"] == "orders"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["list", "--dir", "{root}", "--job", "../x"], "job name '../x' is invalid"),
        (["list", "--dir", "{root}", "--job", "a b"], "job name 'a b' is invalid"),
        (["list", "--dir", "ftp://host/x", "--job", "orders"], "unsupported scheme 'ftp'"),
        (["list", "--dir", "s3:///x", "--job", "orders"], "has no bucket"),
        (["dispose", "--dir", "{root}", "--job", "orders", "{root}/payments/chk-1"],
         "is outside job 'orders'"),
        (["dispose", "--dir", "{root}", "--job", "orders", "{root}/orders/savepoints/../chk-1"], "'..'"),
        (["dispose", "--dir", "{root}", "--job", "orders", "s3://other-bucket/orders/chk-1"],
         "is outside job"),
        (["dispose", "--dir", "{root}", "--job", "orders", "shared"],
         "is not a checkpoint or savepoint directory"),
        (["savepoint", "--dir", "{root}", "--job", "orders", "--timeout", "0"], "'0' is invalid"),
        (["savepoint", "--dir", "{root}", "--job", "orders", "--timeout", "soon"], "'soon' is not a number"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_exits_2_naming_the_value(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str],
                                            message: str) -> None:
    job_with_checkpoints(root, 1)
    code, out, err = run(capsys, *[a.replace("{root}", str(root)) for a in argv])
    assert code == 2, err
    assert message in err and out == ""


def test_missing_local_root_is_an_operational_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "list", "--dir", str(tmp_path / "nope"), "--job", "orders")
    assert code == 1 and "does not exist" in err and "nope" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("list", "status", "savepoint", "dispose", "commit", "demo"):
        assert command in out


# --------------------------------------------------------------------------- list


def test_list_human(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, metas = job_with_checkpoints(root, 3)
    catalog.create_savepoint(catalog.handle(metas[-1]))
    catalog.store.put("chk-2/_metadata", b"{garbled")
    code, out, err = run(capsys, "list", "--dir", str(root), "--job", "orders")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "ID", "BATCH", "GEN", "CREATED", "(UTC)", "DURATION_MS", "COPIED",
                                "TOTAL", "FILES", "URI", "STATUS"]
    assert [line.split()[:2] for line in lines[1:]] == [["checkpoint", "3"], ["checkpoint", "2"],
                                                        ["checkpoint", "1"], ["savepoint", "3"]]
    assert "INVALID: not valid JSON" in lines[2] and lines[1].endswith("valid")
    assert len({line.index("file://") for line in lines[1:]}) == 1  # the URI column is aligned


def test_list_json_shape(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, metas = job_with_checkpoints(root, 2)
    sp = catalog.create_savepoint(catalog.handle(metas[-1]))
    catalog.store.put("chk-3/partial", b"x")
    code, out, _ = run(capsys, "list", "--dir", str(root), "--job", "orders", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"job", "root", "checkpoints", "savepoints"}
    assert doc["root"] == catalog.uri
    assert [e["id"] for e in doc["checkpoints"]] == [3, 2, 1]
    for entry in doc["checkpoints"] + doc["savepoints"]:
        assert set(entry) == ENTRY_KEYS
    invalid, valid = doc["checkpoints"][0], doc["checkpoints"][1]
    assert invalid["valid"] is False and "no _metadata" in invalid["error"] and invalid["batch_id"] is None
    assert valid == {
        "kind": "checkpoint", "id": 2, "uri": f"{catalog.uri}/chk-2", "valid": True, "error": None,
        "batch_id": 1,
        "generation": 1, "created_at": metas[1].created_at, "created": valid["created"], "duration_ms": 12,
        "bytes_copied": 100, "bytes_total": metas[1].total_bytes, "file_count": 2, "source_checkpoint": None,
        "status": "valid", "superseded_by": None, "state_partitions": 1, "verified_at": None,
        "verify_error": None,
    }
    assert invalid["status"] == "invalid" and invalid["state_partitions"] is None
    assert valid["created"].endswith("Z") and "T" in valid["created"]
    assert doc["savepoints"][0]["uri"] == sp.uri and doc["savepoints"][0]["source_checkpoint"] == 2


def test_list_of_an_unknown_job_names_the_known_ones(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    job_with_checkpoints(root, 1)
    code, out, _ = run(capsys, "list", "--dir", str(root), "--job", "ordres")
    assert code == 0 and "no checkpoints or savepoints for job 'ordres'" in out and "orders" in out


def test_corrupt_checkpoint_warning_goes_to_stderr(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 2)
    catalog.store.put("chk-2/_metadata", b"{garbled")
    code, out, err = run(capsys, "status", "--dir", str(root), "--job", "orders")
    assert code == 0 and "chk-1 (batch 0" in out
    assert "sparkpoint: WARNING: skipping invalid checkpoint" in err and "chk-2" in err


# --------------------------------------------------------------------------- status


def test_status_json_live_and_dead(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 2)
    write_status(catalog, last_batch=1, last_checkpoint_id=2, last_checkpoint_uri=catalog.checkpoint_uri(2),
                 host="h", pid=7)
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--json")
    doc = json.loads(out)
    assert code == 0
    assert set(doc) == {"job", "root", "generation", "status_generation", "state", "alive", "heartbeat_age_s",
                        "max_heartbeat_age_s", "started", "last_batch", "last_checkpoint",
                        "latest_checkpoint",
                        "checkpoints_completed", "savepoint", "error", "host", "pid", "application_id",
                        "counts", "latest_savepoint", "latest_restore", "airflow_try", "driver"}
    assert doc["driver"] is None  # no launch record: not started by a submit
    assert (doc["generation"], doc["state"], doc["alive"], doc["last_batch"]) == (1, "running", True, 1)
    assert doc["last_checkpoint"] == {"id": 2, "uri": catalog.checkpoint_uri(2)}
    assert doc["latest_checkpoint"]["id"] == 2 and doc["latest_checkpoint"]["batch_id"] == 1

    write_status(catalog, heartbeat_age=120)
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--json",
                       "--max-heartbeat-age", "60")
    assert json.loads(out)["alive"] is False
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--max-heartbeat-age", "600")
    assert "alive            yes (heartbeat 120 s ago; max 600 s)" in out

    Catalog(open_storage(str(root)), "orders").claim_generation()  # a newer run started, has not written yet
    catalog.write_status({**catalog.read_status(), "heartbeat_at": time.time()})  # type: ignore[dict-item]
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders")
    assert "superseded by generation 2" in out and "alive            no" in out

    write_status(catalog, heartbeat_age=0)  # generation 2 runs; then generation 1's late heartbeat lands
    catalog.write_status({**catalog.read_status(), "generation": 1})  # type: ignore[dict-item]
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--json")
    doc = json.loads(out)
    assert (doc["generation"], doc["status_generation"], doc["alive"]) == (2, 2, True), doc


def test_status_of_a_job_that_never_ran(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["state"], doc["alive"], doc["generation"], doc["latest_checkpoint"]) == (
        "never-started", False, 0, None)
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders")
    assert "never-started" in out and "no (no status record)" in out


# --------------------------------------------------------------------------- dispose


def test_dispose(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, metas = job_with_checkpoints(root, 1)
    sp = catalog.create_savepoint(catalog.handle(metas[0]))
    code, out, _ = run(capsys, "dispose", "--dir", str(root), "--job", "orders", "--json", sp.uri)
    assert (code == 0
            and json.loads(out) == {"job": "orders", "root": catalog.uri, "disposed": sp.uri, "objects": 3})
    assert catalog.list_savepoints() == []
    code, _, err = run(capsys, "dispose", "--dir", str(root), "--job", "orders", sp.uri)
    assert code == 1 and "nothing to dispose" in err
    code, out, _ = run(capsys, "dispose", "--dir", str(root), "--job", "orders", "chk-1")
    assert code == 0 and out.startswith(f"disposed {catalog.uri}/chk-1 (")


# --------------------------------------------------------------------------- savepoint


def test_savepoint_from_checkpoint_without_a_live_job(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 2)
    write_status(catalog, state="failed", heartbeat_age=5, error="boom")
    code, out, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == SAVEPOINT_KEYS | {"checkpoint_id"}
    assert (doc["source"], doc["state"], doc["checkpoint_id"], doc["batch_id"], doc["request_id"]) == (
        "checkpoint", "completed", 2, 1, None)
    [entry] = catalog.list_savepoints()
    assert entry.valid and entry.uri == doc["savepoint"]

    code, out, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--stop")
    assert code == 0 and out.strip().startswith(f"{catalog.uri}/savepoints/savepoint-2-")
    assert "has no live run (last state failed" in err and "nothing to stop" in err


def test_savepoint_refuses_when_asked_or_when_there_is_nothing(
    capsys: pytest.CaptureFixture[str], root: Path
) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    code, _, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--no-from-checkpoint")
    assert code == 1 and "--no-from-checkpoint refuses" in err and "'orders'" in err
    Catalog(catalog.storage, "empty").claim_generation()
    code, _, err = run(capsys, "savepoint", "--dir", str(root), "--job", "empty")
    assert code == 1 and "has no completed checkpoint" in err


def _serve_one(catalog: Catalog, *, stop: bool, fail: str | None = None) -> threading.Thread:
    """A stand-in for the running job: heartbeat, take one request, answer it."""
    def job() -> None:
        channel = ControlChannel(Catalog(catalog.storage, catalog.job))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            write_status(catalog)
            pending = channel.pending(catalog.current_generation())
            if pending:
                request = pending[0]
                channel.acknowledge(request, 1)
                if fail:
                    channel.fail(request, generation=1, error=fail)
                    return
                handle = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
                channel.complete(request, generation=1, savepoint=handle.uri,
                                 batch_id=handle.metadata.batch_id)
                if stop:
                    write_status(catalog, state="stopped", savepoint_uri=handle.uri)
                return
            time.sleep(0.02)

    write_status(catalog)
    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("stop", [False, True])
def test_savepoint_of_a_running_job(capsys: pytest.CaptureFixture[str], root: Path, stop: bool) -> None:
    catalog, _ = job_with_checkpoints(root, 2)
    thread = _serve_one(catalog, stop=stop)
    argv = ["savepoint", "--dir", str(root), "--job", "orders", "--json", "--timeout", "20", "--poll", "0.05"]
    code, out, err = run(capsys, *argv, *(["--stop"] if stop else []))
    thread.join(5)
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == SAVEPOINT_KEYS
    assert (doc["kind"], doc["source"], doc["state"], doc["generation"], doc["batch_id"]) == (
        "stop" if stop else "savepoint", "running-job", "completed", 1, 1)
    assert doc["savepoint"] == catalog.list_savepoints()[0].uri


def test_savepoint_failure_exits_1(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    thread = _serve_one(catalog, stop=False, fail="disk full")
    code, out, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--poll", "0.05")
    thread.join(5)
    assert code == 1 and out == ""
    assert "failed in generation 1: disk full" in err and "of job 'orders'" in err


def test_savepoint_timeout_and_no_wait(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    stop_beating = threading.Event()

    def heartbeat() -> None:  # alive, but never answers
        while not stop_beating.is_set():
            write_status(catalog)
            time.sleep(0.05)

    write_status(catalog)
    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        code, _, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--timeout", "0.3",
                           "--poll", "0.05")
        assert code == 1 and "nobody acknowledged it within its timeout of 0.3 s" in err, err
        code, out, _ = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--no-wait", "--json")
        doc = json.loads(out)
        assert code == 0 and set(doc) == SAVEPOINT_KEYS and doc["state"] == "pending"
        assert [r.id for r in ControlChannel(catalog).pending()] == [doc["request_id"]]
    finally:
        stop_beating.set()
        beat.join()


def test_savepoint_when_the_job_dies_while_waiting(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    write_status(catalog)

    def die() -> None:
        time.sleep(0.2)
        write_status(catalog, state="failed", error="executor lost")

    killer = threading.Thread(target=die)
    killer.start()
    started = time.monotonic()
    code, _, err = run(capsys, "savepoint", "--dir", str(root), "--job", "orders", "--poll", "0.05")
    killer.join()
    assert code == 1 and "the job is not running" in err
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- commit, demo


def test_commit_missing_module_says_so(capsys: pytest.CaptureFixture[str], root: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow_sparkpoint.services.commit", None)
    code, _, err = run(capsys, "commit", "--dir", str(root), "--job", "orders")
    assert code == 1
    assert ("`sparkpoint commit` is not available in this installation: module "
            "airflow_sparkpoint.services.commit" in err)


def test_commit_calls_commit_pending(capsys: pytest.CaptureFixture[str], root: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Catalog, dict[str, Any]]] = []

    def commit_pending(catalog: Catalog, *, storage_options: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        calls.append((catalog, {**storage_options, **kwargs}))
        return {"committed": ["orders-b3-g1", "orders-b4-g1"], "aborted": []}

    fake = types.ModuleType("airflow_sparkpoint.services.commit")
    fake.commit_pending = commit_pending  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow_sparkpoint.services.commit", fake)
    code, out, _ = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--json")
    assert code == 0
    assert json.loads(out) == {"job": "orders", "root": f"file://{root}/orders",
                               "result": {"committed": ["orders-b3-g1", "orders-b4-g1"], "aborted": []}}
    assert calls[0][0].job == "orders" and calls[0][1] == {}
    code, out, _ = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--upto-batch", "4")
    assert out.splitlines() == ["committed  2: orders-b3-g1, orders-b4-g1", "aborted    0"]
    assert calls[1][1] == {"upto_batch": 4}
    code, _, err = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--upto-batch", "-1")
    assert code == 2 and "'-1' is invalid" in err


def test_commit_abort_generation_discards_green_and_is_refused_while_it_runs(
    capsys: pytest.CaptureFixture[str], root: Path
) -> None:
    catalog = Catalog(open_storage(str(root)), "orders")
    catalog.claim_generation()  # blue: generation 1
    catalog.claim_generation()  # green: generation 2
    for batch, generation in ((3, 1), (4, 2), (5, 2)):
        catalog.put_transaction(transaction_record(AbortRecordingSink(), batch, generation, job="orders"))
    write_status(catalog)  # green is running
    AbortRecordingSink.aborted.clear()

    code, _, err = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--abort-generation", "2")
    assert code == 1 and "generation 2 of job 'orders' is still running" in err
    assert AbortRecordingSink.aborted == []

    write_status(catalog, state="failed")
    code, out, _ = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--abort-generation", "2",
                       "--json")
    assert code == 0
    assert json.loads(out)["result"] == {"aborted": ["orders-b4-g2", "orders-b5-g2"]}
    assert AbortRecordingSink.aborted == ["orders-b4-g2", "orders-b5-g2"]
    assert [r.txn_id for r in catalog.transactions()] == ["orders-b3-g1"]  # blue's is untouched
    code, _, err = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--abort-generation", "0")
    assert code == 2 and "'0' is invalid; expected a generation >= 1" in err
    code, _, err = run(capsys, "commit", "--dir", str(root), "--job", "orders", "--abort-generation", "2",
                       "--upto-batch", "3")
    assert code == 2 and "not allowed with argument" in err


def test_demo_passes_its_arguments_through(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("airflow_sparkpoint.demo")
    def demo_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    fake.main = demo_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow_sparkpoint.demo", fake)
    code, _, _ = run(capsys, "demo", "--workdir", "/tmp/x", "--fast")
    assert code == 0 and seen == [["--workdir", "/tmp/x", "--fast"]]
    monkeypatch.setitem(sys.modules, "airflow_sparkpoint.demo", None)
    code, _, err = run(capsys, "demo", "--workdir", "/tmp/x")
    assert code == 1 and "`sparkpoint demo` is not available" in err


# --------------------------------------------------------------------------- S3


@pytest.mark.s3
def test_list_and_savepoint_on_s3(capsys: pytest.CaptureFixture[str], s3_server: str, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/root"
    catalog = Catalog(open_storage(uri, endpoint_url=s3_server, region_name="us-east-1"), "orders")
    catalog.claim_generation()
    checkpoint(catalog, 0)
    s3 = ["--dir", uri, "--job", "orders", "--s3-endpoint", s3_server, "--s3-region", "us-east-1", "--json"]
    code, out, err = run(capsys, "list", *s3)
    assert code == 0, err
    assert json.loads(out)["checkpoints"][0]["uri"] == f"s3://{s3_bucket}/root/orders/chk-1"
    code, out, err = run(capsys, "savepoint", *s3)
    assert code == 0, err
    assert json.loads(out)["savepoint"].startswith(f"s3://{s3_bucket}/root/orders/savepoints/savepoint-1-")
    code, _, err = run(capsys, "list", "--dir", "s3://no-such-bucket-here/x", "--job", "orders",
                       "--s3-endpoint", s3_server, "--s3-region", "us-east-1")
    assert code == 1 and "no-such-bucket-here" in err


# --------------------------------------------------------------------------- history: list, status, metrics


def test_list_shows_the_last_restore_drill_and_state_partitions(capsys: pytest.CaptureFixture[str],
                                                                  root: Path) -> None:
    from airflow_sparkpoint.checkpoints.verification import VerificationRecord, write_verification

    catalog, _ = job_with_checkpoints(root, 2)
    write_verification(catalog.store, "chk-2", VerificationRecord(1795307061.1, "state", 2.0))
    write_verification(catalog.store, "chk-1", VerificationRecord(1795307000.0, "files", 1.0, error="file x"))
    code, out, _ = run(capsys, "list", "--dir", str(root), "--job", "orders", "--json")
    doc = json.loads(out)
    assert code == 0
    assert [(e["verified_at"], e["verify_error"], e["state_partitions"]) for e in doc["checkpoints"]] == [
        (1795307061.1, None, 1), (1795307000.0, "file x", 1)]
    code, out, _ = run(capsys, "list", "--dir", str(root), "--job", "orders")
    lines = out.splitlines()
    assert code == 0
    assert lines[1].endswith("valid; verified 2026-11-22T00:24:21Z")
    assert lines[2].endswith("valid; drill FAILED 2026-11-22T00:23:20Z")


def test_status_shows_counts_and_the_airflow_try_of_the_generation(capsys: pytest.CaptureFixture[str],
                                                                  root: Path) -> None:
    catalog = Catalog(open_storage(str(root)), "orders")
    catalog.claim_generation({"plan": "empty state", "airflow": {"dag_id": "etl", "task_id": "run",
                                                                 "try_number": "1"}})
    checkpoint(catalog, 0)
    catalog.claim_generation({"plan": f"latest checkpoint {catalog.checkpoint_uri(1)} (batch 0)",
                              "airflow": {"dag_id": "etl", "task_id": "run", "try_number": "2"}})
    write_status(catalog)
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders")
    assert code == 0
    assert "started by       etl.run try 2" in out
    assert "checkpoints      1 completed, 0 failed, 0 in progress, 1 restored (retained history only)" in out
    assert "last restore     generation 2 from chk-1" in out
    code, out, _ = run(capsys, "status", "--dir", str(root), "--job", "orders", "--json")
    doc = json.loads(out)
    assert doc["airflow_try"] == {"dag_id": "etl", "task_id": "run", "run_id": "", "try_number": 2,
                                "map_index": None}
    assert doc["counts"]["restored"] == 1 and doc["latest_restore"]["generation"] == 2


def test_metrics_prints_prometheus_text_for_each_job(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    job_with_checkpoints(root, 2)
    other = Catalog(open_storage(str(root)), "payments")
    other.claim_generation()
    code, out, err = run(capsys, "metrics", "--dir", str(root), "--job", "orders", "--job", "payments")
    assert code == 0, err
    lines = out.splitlines()
    assert "# TYPE sparkpoint_numberOfCompletedCheckpoints counter" in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{job="orders"} 2' in lines
    assert 'sparkpoint_numberOfCompletedCheckpoints{job="payments"} 0' in lines
    assert 'sparkpoint_lastCheckpointDuration{job="orders"} 12' in lines
    assert 'sparkpoint_generation{job="payments"} 1' in lines
    assert sum(line.startswith("# HELP sparkpoint_generation ") for line in lines) == 1
    code, out, _ = run(capsys, "metrics", "--dir", str(root), "--job", "orders", "--json")
    assert json.loads(out)["jobs"][0]["metrics"]["numberOfCompletedCheckpoints"] == 2


def test_metrics_needs_a_job(capsys: pytest.CaptureFixture[str], root: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, "metrics", "--dir", str(root))
    assert code == 2 and "--job is required" in err
    job_with_checkpoints(root, 1)
    monkeypatch.setenv("SPARKPOINT_JOB", "orders")
    code, out, _ = run(capsys, "metrics", "--dir", str(root))
    assert code == 0 and 'sparkpoint_generation{job="orders"} 1' in out
    code, _, err = run(capsys, "metrics", "--dir", str(root), "--job", "../x")
    assert code == 2 and "job name '../x' is invalid" in err


# --------------------------------------------------------------------------- verify without a snapshot


def test_verify_json_of_an_incomplete_checkpoint_prints_the_failure_and_records_nothing(
        capsys: pytest.CaptureFixture[str], root: Path) -> None:
    """A directory `list` shows as INVALID (no _metadata): `verify --json` still prints its
    document (docs/CLI.md), exits 1, and writes no record into the directory."""
    catalog, _ = job_with_checkpoints(root, 1)
    catalog.store.put("chk-9/state/0/0/1.delta", b"partial")
    code, out, err = run(capsys, "list", "--dir", str(root), "--job", "orders", "--json")
    [entry] = [e for e in json.loads(out)["checkpoints"] if e["uri"].endswith("/chk-9")]
    assert code == 0 and not entry["valid"] and "no _metadata" in entry["error"]

    code, out, err = run(capsys, "verify", "--dir", str(root), "--job", "orders", "chk-9", "--json")

    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False, (code, doc)
    assert (doc["uri"] == entry["uri"] and doc["kind"] is None and doc["batch_id"] is None
            and doc["checks"] == {})
    assert "has no _metadata" in doc["error"] and doc["error"] in err
    assert sorted(p.name for p in (root / "orders" / "chk-9").iterdir()) == ["state"], "nothing recorded"
