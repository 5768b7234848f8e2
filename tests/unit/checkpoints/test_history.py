"""The history read model over a real local store: snapshot records (valid, invalid,
superseded, drilled), generation records (origin, Airflow try, configuration, outcome),
the lifetime counters, the whole view's derived figures, and its cost."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog, SnapshotEntry
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.counters import (
    COUNTERS,
    RECENT_LIMIT,
    CheckpointCounters,
    CounterRecorder,
    read_counters,
)
from airflow_sparkpoint.checkpoints.history import (
    GENERATIONS_SHOWN,
    SnapshotRecord,
    generation_details,
    generation_records,
    liveness,
    load_history,
    plan_origin,
    snapshot_records,
)
from airflow_sparkpoint.checkpoints.retention import enforce_checkpoint_retention
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.checkpoints.verification import VerificationRecord, write_verification
from airflow_sparkpoint.exceptions import StorageError
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.storage import LocalStorage, open_storage
from tests.support.records import job_status, state_checkpoint, transaction_record, write_status


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(open_storage(str(tmp_path)), "orders")


# ---------------------------------------------------------------------------- snapshots


def test_snapshot_records_carry_status_partitions_and_the_last_drill(catalog: Catalog) -> None:
    catalog.claim_generation()
    first = state_checkpoint(catalog, 0, partitions=4)
    state_checkpoint(catalog, 1)
    catalog.store.put("chk-3/partial", b"x")  # an incomplete directory
    write_verification(catalog.store, "chk-1", VerificationRecord(time.time(), "state", 1.5))
    write_verification(catalog.store, "chk-2",
                       VerificationRecord(123.0, "files", 0.1, error="chk-2: file x corrupt"))
    records = snapshot_records(catalog, "checkpoint")
    assert [(r.id, r.status) for r in records] == [(3, "invalid"), (2, "valid"), (1, "valid")]
    incomplete, second, oldest = records
    assert incomplete.batch_id is None and incomplete.state_partitions is None
    assert ("no _metadata" in (incomplete.error or "")
            and incomplete.short_reason().startswith("INVALID: no _metadata"))
    assert (oldest.batch_id, oldest.state_partitions, oldest.duration_ms) == (0, 4, 10)
    assert oldest.bytes_total == first.total_bytes and oldest.file_count == 5
    assert oldest.verified_at is not None and oldest.verify_error is None and oldest.verify_level == "state"
    assert (second.verified_at, second.verify_error) == (123.0, "chk-2: file x corrupt")
    assert second.to_json()["verified_at"] == 123.0 and second.to_json()["status"] == "valid"
    assert snapshot_records(catalog, "checkpoint", drills=False)[2].verified_at is None


def test_a_superseded_checkpoint_is_valid_but_not_restorable(catalog: Catalog) -> None:
    catalog.claim_generation()
    meta = state_checkpoint(catalog, 4)
    entry = SnapshotEntry("checkpoint", meta.id, catalog.checkpoint_uri(meta.id), f"chk-{meta.id}", meta,
                          superseded_by=3)
    record = SnapshotRecord.from_entry(entry, catalog)
    assert record.valid and not record.restorable and record.status == "superseded"
    assert record.to_json()["superseded_by"] == 3 and record.to_json()["valid"] is True
    assert record.short_reason() == "superseded (generation 3)"


def test_snapshot_kind_is_checked(catalog: Catalog) -> None:
    with pytest.raises(ValueError, match="'chk' is invalid"):
        snapshot_records(catalog, "chk")


# ---------------------------------------------------------------------------- generations


def test_generation_details_record_the_config_and_the_airflow_try() -> None:
    cfg = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/x", "spark.sparkpoint.job": "orders",
                                      "spark.sparkpoint.checkpoint.numRetained": "5",
                                      "spark.sparkpoint.commit.mode": "external"})
    env = {"AIRFLOW_CTX_DAG_ID": "etl", "AIRFLOW_CTX_TASK_ID": "run", "AIRFLOW_CTX_TRY_NUMBER": "2",
           "AIRFLOW_CTX_DAG_RUN_ID": "manual__1", "AWS_SECRET_ACCESS_KEY": "never-recorded"}
    details = generation_details(cfg, env)
    assert details["airflow"] == {"dag_id": "etl", "task_id": "run", "try_number": "2", "run_id": "manual__1",
                                  # unmapped, recorded so a claim without it is known to be older
                                  "map_index": ""}
    assert details["config"]["checkpoint.numRetained"] == 5 and details["config"]["commit.mode"] == "external"
    assert details["config"]["restore"] == "latest" and details["config"]["trigger"] == "availableNow"
    assert "never-recorded" not in json.dumps(details)
    assert "airflow" not in generation_details(None, {})


def test_generation_records_say_what_each_start_restored_who_started_it_and_how_it_ended(
    catalog: Catalog
) -> None:
    catalog.claim_generation({"plan": "empty state (no completed checkpoint yet)", "restore": "latest",
                              "airflow": {"dag_id": "etl", "task_id": "run", "try_number": "1"}})
    chk = catalog.checkpoint_uri(1)
    catalog.claim_generation({"plan": f"latest checkpoint {chk} (batch 2)", "app": "local-1",
                              "airflow": {"dag_id": "etl", "task_id": "run", "try_number": "2"},
                              "config": {"commit.mode": "checkpoint"}})
    write_run_result(catalog,
                     RunResult(status="finished", job=catalog.job, generation=2, first_batch=3, last_batch=7,
                               committed_batches=(3,), restored_from=chk))
    sp = f"{catalog.uri}/savepoints/savepoint-4-ab12cd34"
    catalog.claim_generation({"plan": f"savepoint {sp} (batch 7)"})
    write_status(catalog, "failed", error="boom")
    catalog.claim_generation()  # claimed, never reported

    newest, failed, finished, first = generation_records(catalog)
    assert (newest.generation, newest.outcome, newest.origin) == (4, "unknown", "-")
    assert (failed.outcome, failed.error, failed.restored_from, failed.origin) == ("failed", "boom", sp,
                                                                                    "savepoint-4-ab12cd34")
    assert (finished.outcome, finished.restored_from, finished.application_id) == ("finished", chk, "local-1")
    assert finished.airflow is not None and finished.airflow.describe() == "etl.run try 2"
    assert finished.to_json()["committed_batches"] == [3] and finished.config == {"commit.mode": "checkpoint"}
    assert (first.outcome, first.restored, first.origin) == ("superseded", False, "empty state")
    assert [g.generation for g in generation_records(catalog, limit=2)] == [4, 3]
    assert plan_origin("resume in place at batch 3 (s3://b/p/orders/chk-4)") == "s3://b/p/orders/chk-4"
    assert plan_origin(None) is None


# ---------------------------------------------------------------------------- counters


def test_counter_recorder_adds_to_what_earlier_generations_counted(catalog: Catalog) -> None:
    first = CounterRecorder(catalog, 1)
    first.restored()
    first.completed(10.0)
    first.failed(11.0)
    second = CounterRecorder(catalog, 2)
    second.completed(12.0)
    second.completed(13.0)
    counters = read_counters(catalog)
    assert counters is not None
    assert (counters.completed, counters.failed, counters.restored, counters.generation) == (3, 1, 1, 2)
    assert counters.recent == ((10.0, True), (11.0, False), (12.0, True), (13.0, True))
    assert counters.failure_ratio(2) == (0.0, 2) and counters.failure_ratio(4) == (0.25, 4)
    assert CheckpointCounters().failure_ratio(5) == (None, 0)


def test_counters_remember_only_the_newest_attempts_and_never_fail_the_job(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = CounterRecorder(catalog, 1)
    for i in range(RECENT_LIMIT + 5):
        recorder.completed(float(i))
    counters = read_counters(catalog)
    assert (counters is not None and counters.completed == RECENT_LIMIT + 5
            and len(counters.recent) == RECENT_LIMIT)
    assert counters.recent[0][0] == 5.0

    def broken(key: str, data: bytes) -> None:
        raise StorageError("disk full")

    catalog.store.put = broken  # type: ignore[method-assign]
    recorder.failed()  # logged, not raised
    assert "could not update the checkpoint counters of job 'orders': disk full" in caplog.text


def test_an_unreadable_counters_record_is_ignored(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    catalog.store.put(COUNTERS, b"[1, 2]")
    assert read_counters(catalog) is None and "ignoring unreadable counters record" in caplog.text
    catalog.store.put(COUNTERS, json.dumps({"schema_version": 99}).encode())
    assert read_counters(catalog) is None


# ---------------------------------------------------------------------------- the whole view


def test_the_view_derives_counts_latest_and_summary_from_the_retained_history(catalog: Catalog) -> None:
    catalog.claim_generation({"plan": "empty state (no completed checkpoint yet)",
                              "airflow": {"dag_id": "etl", "task_id": "run", "try_number": "1"}})
    state_checkpoint(catalog, 0, duration=10, copied=100)
    state_checkpoint(catalog, 1, duration=30, copied=50)
    catalog.store.put("chk-3/partial", b"x")  # newer than every valid one
    sp = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
    write_status(catalog, "running", last_batch=1)
    channel = ControlChannel(catalog)
    request = channel.submit("savepoint", timeout_s=600, generation=1)
    done = channel.submit("stop", timeout_s=600, generation=1)
    channel.acknowledge(done, 1)
    channel.complete(done, generation=1, savepoint=sp.uri, batch_id=1)
    catalog.put_transaction(transaction_record("delta", 2, 1, job="orders", sink_id="delta:/t",
                                               payload={"secret-ish": "staged"}, created_at=5.0))

    history = load_history(catalog)
    assert history.alive and history.generation == 1
    assert [r.id for r in history.in_progress] == [3] and history.failed == []
    counts = history.counts
    assert ((counts.completed, counts.failed, counts.in_progress, counts.restored, counts.lifetime)
            == (2, 0, 1, 0,
              False))
    assert history.latest_completed is not None and history.latest_completed.id == 2
    assert history.latest_savepoint is not None and history.latest_savepoint.uri == sp.uri
    assert (history.duration_ms.min, history.duration_ms.avg, history.duration_ms.max) == (10, 20, 30)  # type: ignore[union-attr]
    assert (history.bytes_copied.min, history.bytes_copied.max) == (50, 100)  # type: ignore[union-attr]
    assert [(r.id, r.state) for r in history.requests] == [(request.id, "pending")]
    assert [t.txn_id for t in history.staged] == ["orders-b2-g1"]
    assert history.dag_ids == ["etl"] and history.current is not None
    document = json.loads(json.dumps(history.to_json()))
    assert document["airflow_try"]["try_number"] == 1 and document["counts"]["in_progress"] == 1
    assert "secret-ish" not in json.dumps(document), "transaction payloads are not part of the view"

    # the driver died: the incomplete directory is abandoned
    write_status(catalog, "running", heartbeat_age=600)
    history = load_history(catalog)
    assert not history.alive and [r.id for r in history.failed] == [3] and history.counts.failed == 1


def test_lifetime_counts_come_from_the_counters_record(catalog: Catalog) -> None:
    catalog.claim_generation()
    state_checkpoint(catalog, 0)
    recorder = CounterRecorder(catalog, 1)
    for _ in range(40):
        recorder.completed()
    recorder.failed()
    recorder.restored()
    counts = load_history(catalog).counts
    assert (counts.completed, counts.failed, counts.restored, counts.lifetime) == (40, 1, 1, True)


def test_latest_completed_skips_superseded_checkpoints(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.claim_generation()
    old = state_checkpoint(catalog, 0, created_at=100.0)
    abandoned = state_checkpoint(catalog, 5, created_at=200.0)
    entries = catalog.list_checkpoints()
    marked = [SnapshotEntry(e.kind, e.id, e.uri, e.key, e.metadata, e.error,
                            superseded_by=2 if e.id == abandoned.id else None) for e in entries]
    monkeypatch.setattr(catalog, "list_checkpoints", lambda **_: marked)
    history = load_history(catalog)
    assert history.latest_completed is not None and history.latest_completed.id == old.id
    assert [r.status for r in history.checkpoints] == ["superseded", "valid"]


def test_liveness_requires_a_fresh_heartbeat_of_the_newest_generation() -> None:
    running = job_status(job="j", generation=2, heartbeat_at=100.0)
    assert liveness(running, 2, 60, now=130.0) == (True, 30.0)
    assert liveness(running, 3, 60, now=130.0) == (False, 30.0)
    assert liveness(running, 2, 10, now=130.0)[0] is False
    assert liveness(None, 0, 60) == (False, None)


class CountingStorage(LocalStorage):
    """Counts reads (GETs) and listings, to check what the model costs."""

    gets = 0
    lists = 0

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        type(self).gets += 1
        return super().get(key, max_bytes)

    def list(self, prefix: str = "") -> Iterator[Any]:
        type(self).lists += 1
        return super().list(prefix)


def test_the_cost_is_bounded_by_the_retained_history_not_by_every_batch_ever(tmp_path: Path) -> None:
    catalog = Catalog(CountingStorage(str(tmp_path)), "orders")
    for generation in range(1, 61):  # 60 starts, 3 checkpoints each; retention keeps 3
        catalog.claim_generation({"plan": "empty state"})
        for batch in range(3):
            state_checkpoint(catalog, generation * 3 + batch)
            enforce_checkpoint_retention(catalog, 3)
    CountingStorage.gets = CountingStorage.lists = 0
    history = load_history(catalog)
    assert len(history.checkpoints) == 3 and len(history.generations) == GENERATIONS_SHOWN
    # 3 x (_metadata + drill) + 20 x (generation + result) + status + counters
    assert CountingStorage.gets <= 3 * 2 + GENERATIONS_SHOWN * 2 + 2, CountingStorage.gets
    assert CountingStorage.lists <= 10, CountingStorage.lists
    assert json.loads(catalog.store.get(layout.generation_key(60)))["generation"] == 60
