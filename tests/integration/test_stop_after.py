"""Blue's side of a zero-downtime cutover with a real Spark driver: a processingTime job
asked to stop after batch N stages and commits exactly batches 0..N (never N+1, though
more input is there), stops by itself once N is confirmed, and reports its final
checkpoint and its final savepoint at N; a stop_after below the batch it has started is refused and the job
runs on. Output is checked against a plain-Python oracle from the input files."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from tests.support.inputs import write_json_batches
from tests.support.waits import wait_for

pytestmark = pytest.mark.spark


def _rows(batch: int) -> list[dict[str, Any]]:
    return [{"user": f"u{(batch + i) % 3}", "amount": 10 * batch + i + 1} for i in range(3)]


def _start(spark: Any, root: Path, inputs: Path, out: Path, sink_kind: str) -> tuple[threading.Thread, dict]:
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink, DirectorySink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": "orders",
        "spark.sparkpoint.trigger": "processingTime:1s", "spark.sparkpoint.control.pollInterval": "300ms",
        "spark.sparkpoint.stateStore": "hdfs",
    }, argv=[])
    events = (spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
              .json(str(inputs)))
    sink = (DeltaSink(str(out), mode="append") if sink_kind == "delta"
            else DirectorySink(str(out), format="json"))
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = job.run(events, sink=sink, output_mode="append")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def _visible(out: Path, sink_kind: str) -> list[tuple[str, int]]:
    if sink_kind == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(out)).to_pyarrow_table().to_pylist()
    else:
        rows = [json.loads(line) for path in out.rglob("*.json")
                if not any(part.startswith(("_", ".")) for part in path.relative_to(out).parts)
                for line in path.read_text().splitlines() if line.strip()]
    return sorted((r["user"], r["amount"]) for r in rows)


def _oracle(batches: range) -> list[tuple[str, int]]:
    return sorted((r["user"], r["amount"]) for b in batches for r in _rows(b))


@pytest.mark.parametrize("sink_kind", ["delta", "directory"])
def test_blue_stops_exactly_after_the_agreed_batch(spark, tmp_path, sink_kind):
    root, inputs, out = tmp_path / "root", tmp_path / "input", tmp_path / "out"
    write_json_batches(inputs, [_rows(b) for b in range(2)])
    thread, outcome = _start(spark, root, inputs, out, sink_kind)
    catalog = Catalog.open(str(root), "orders")
    channel = ControlChannel(catalog)
    wait_for("batch 1", lambda: (catalog.read_status() or {}).get("last_batch") == 1, 120)
    generation = int(catalog.read_status()["generation"])  # type: ignore[index]
    request = channel.submit("stop_after", generation=generation, timeout_s=120, after_batch=3)
    write_json_batches(inputs, [_rows(b) for b in range(2, 7)], start=2)  # input past N is there
    result = channel.wait(request.id, timeout_s=120, poll_s=0.3)
    thread.join(120)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert (result.state, result.batch_id) == ("completed", 3)
    final = catalog.own_snapshot(result.checkpoint)  # type: ignore[arg-type]
    assert final is not None and final.metadata.batch_id == 3 and final.metadata.generation == generation
    # ...and its final savepoint of N, listed under savepoints/ (what a rollback after a cutover restores)
    assert result.savepoint is not None and "/savepoints/" in result.savepoint, result
    saved = catalog.own_snapshot(result.savepoint)
    assert saved is not None and saved.metadata.kind == "savepoint"
    assert (saved.metadata.batch_id, saved.metadata.generation) == (3, generation)
    assert result.savepoint in [e.uri for e in catalog.list_savepoints() if e.metadata is not None]
    run = outcome["result"]
    assert (run.status, run.last_batch) == ("stopped", 3)
    assert run.savepoint == result.savepoint  # blue's task result names it too
    assert _visible(out, sink_kind) == _oracle(range(4)), "exactly batches 0..3 are visible"
    assert catalog.transactions() == [], "batch 4 was never staged nor recorded"
    live = Path(run.live_dir)
    assert not (live / "commits" / "4").exists()


def test_a_stop_after_below_the_started_batch_is_refused_and_the_job_runs_on(spark, tmp_path):
    root, inputs, out = tmp_path / "root", tmp_path / "input", tmp_path / "out"
    write_json_batches(inputs, [_rows(b) for b in range(3)])
    thread, outcome = _start(spark, root, inputs, out, "directory")
    catalog = Catalog.open(str(root), "orders")
    channel = ControlChannel(catalog)
    wait_for("batch 2", lambda: (catalog.read_status() or {}).get("last_batch") == 2, 120)
    generation = int(catalog.read_status()["generation"])  # type: ignore[index]
    refused = channel.submit("stop_after", generation=generation, timeout_s=60, after_batch=1)
    wait_for("the refusal", lambda: channel.result(refused.id).state == "failed", 60)
    assert "cannot stop after batch 1: already past batch 1" in (channel.result(refused.id).error or "")
    write_json_batches(inputs, [_rows(b) for b in range(3, 5)], start=3)
    wait_for("batch 4", lambda: (catalog.read_status() or {}).get("last_batch") == 4, 120)
    assert thread.is_alive(), "a refused stop_after must not stop the job"
    stop = channel.submit("stop", generation=generation, timeout_s=120)
    channel.wait(stop.id, timeout_s=120, poll_s=0.3)
    thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    assert _visible(out, "directory") == _oracle(range(5))
