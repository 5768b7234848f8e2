"""``inspect`` reads back exactly the state the pipelines put in.

Each case runs a real stateful pipeline (aggregation, dropDuplicates, a stream-stream
join, transformWithStateInPandas with value/list/map state, the seed threshold pipeline
with list + value state) over known input through `SparkpointJob`, takes a savepoint,
and compares what `inspect` reports (operators, stores, partitions, row and key counts,
the rows themselves) with the state computed from the input in plain Python
(`tests/support/state_cases.py`). Also: the snapshot and the job's root are byte-for-byte
unchanged and the scratch copy is gone afterwards; ``latest``; the CLI's JSON contract;
state TTL visible in the row counts; a snapshot on S3 inspected by the real
``sparkpoint`` console script in a fresh process (a fresh JVM) and verified there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.runtime.state_inspect import inspect_snapshot, open_state, rows_as_json, state_rows
from tests.support import state_cases
from tests.support.inputs import write_json_batches
from tests.support.state_cases import CASES, Case
from tests.support.trees import tree_digest

pytestmark = pytest.mark.spark

SHUFFLE_PARTITIONS = 2  # the spark fixture's spark.sql.shuffle.partitions


class Built:
    def __init__(self, case: Case, root: Path, catalog: Catalog, savepoint: SnapshotHandle,
                 result: Any) -> None:
        self.case, self.root, self.catalog, self.savepoint, self.result = (case, root, catalog, savepoint,
                                                                           result)


@pytest.fixture(scope="module")
def built(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """Runs a case once per module (on first use) and takes a savepoint of it."""
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            case = CASES[name]()
            base = tmp_path_factory.mktemp("state-" + "".join(c if c.isalnum() else "-" for c in name))
            write_json_batches(base / "input", case.files)
            result = state_cases.run_case(spark, case, str(base / "root"), "job", base / "input",
                                          base / "table")
            assert result.status == "finished" and result.last_batch >= len(case.files) - 1
            catalog = Catalog.open(str(base / "root"), "job")
            latest = catalog.latest()
            assert latest is not None
            savepoint = catalog.create_savepoint(catalog.handle(latest))
            cache[name] = Built(case, base / "root", catalog, savepoint, result)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_inspect_reads_back_exactly_the_state_the_pipeline_put_in(spark, built, tmp_path, name):
    b = built(name)
    before = tree_digest(b.root)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    state = inspect_snapshot(spark, b.savepoint.uri, scratch_dir=str(scratch))

    assert state.uri == b.savepoint.uri and state.kind == "savepoint" and state.job == "job"
    assert state.batch_id == b.savepoint.metadata.batch_id == b.result.last_batch
    [op] = state.operators
    assert op.name == b.case.operator
    assert op.partitions == SHUFFLE_PARTITIONS == b.savepoint.metadata.partitions_by_operator[op.id]
    assert {s.name: s.type for s in op.stores} == b.case.types
    with open_state(spark, b.savepoint.uri, scratch_dir=str(scratch)) as snap:
        for store in op.stores:
            expected = b.case.expected[store.name]
            assert expected, f"the oracle of {name}/{store.name} is empty: the case checks nothing"
            assert ((store.rows, store.keys)
                    == (state_cases.row_count(expected), state_cases.key_count(expected))), \
                store.name
            rows = rows_as_json(snap.rows(op.id, store.name))
            assert state_cases.observed(rows, store.type) == expected, store.name
            assert {r["partition"] for r in rows} <= set(range(op.partitions))
            assert store.key_schema.startswith("STRUCT<") and store.value_schema.startswith("STRUCT<")
    assert tree_digest(b.root) == before, "inspect changed the snapshot or the job's files"
    assert list(scratch.iterdir()) == [], "the scratch copy was left behind"


def test_inspect_schemas_and_join_internals(spark, built):
    agg = inspect_snapshot(spark, built("aggregation").savepoint.uri)
    [store] = agg.operators[0].stores
    assert store.key_schema == "STRUCT<user: STRING>"
    assert store.value_schema == "STRUCT<sum: BIGINT, count: BIGINT>"  # Spark's aggregation buffer
    tws = inspect_snapshot(spark, built("transformWithState value/list/map").savepoint.uri)
    stores = {s.name: s for s in tws.operators[0].stores}
    assert stores["tags"].map_key_schema == "STRUCT<tag: STRING>"
    assert stores["tags"].value_schema == "STRUCT<count: BIGINT>"
    assert stores["recent"].value_schema == "STRUCT<amount: BIGINT>"
    assert not any(s.ttl for s in stores.values()) and tws.operators[0].time_mode == "NoTime"
    # Spark's internal join stores can be read by name too: one keyToNumValues row per key
    join = built("stream-stream join")
    with open_state(spark, join.savepoint.uri) as snap:
        counts = rows_as_json(snap.rows(store="left-keyToNumValues"))
    assert {tuple(r["key"].values()): r["value"]["value"] for r in counts} == {
        key: 1 for key, _ in join.case.expected["left"]}


def test_rows_filtered_by_key_and_bad_selections_name_what_exists(spark, built):
    b = built("threshold alerts (list + value)")
    with open_state(spark, b.savepoint.uri) as snap:
        rows = rows_as_json(snap.rows(store="over_limit", key={"sensor": "s1"}))
        assert state_cases.observed(rows, "list") == {
            k: v for k, v in b.case.expected["over_limit"].items() if k[0] == ("s1",)}
        assert rows_as_json(snap.rows(store="alerts", key={"sensor": "nobody"})) == []
        with pytest.raises(ConfigError, match="'device'.*fields are: sensor"):
            snap.rows(store="alerts", key={"device": "s1"})
        with pytest.raises(ConfigError, match="store 'nope'.*its stores: alerts, over_limit"):
            snap.rows(store="nope")
        with pytest.raises(ConfigError, match="operator 3 is not in .*operators: 0"):
            snap.rows(operator=3)


def test_state_rows_dataframe_outlives_the_scratch_copy(spark, built, tmp_path):
    b = built("aggregation")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    df = state_rows(spark, b.savepoint.uri, key={"user": "u3"}, scratch_dir=str(scratch))
    assert list(scratch.iterdir()) == []
    assert [(r["key"]["user"], r["value"]["sum"], r["value"]["count"]) for r in df.collect()] == [
        ("u3", b.case.expected["default"][(("u3",), None)][0], 1)]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_inspect_latest_json_contract_and_rows(spark, built, capsys):
    b = built("threshold alerts (list + value)")
    code, out, err = _cli(capsys, "inspect", "--dir", str(b.root), "--job", "job", "latest", "--json")
    assert code == 0, err
    doc = json.loads(out)
    latest = b.catalog.latest()
    assert doc["uri"] == b.catalog.checkpoint_uri(latest.id) and doc["kind"] == "checkpoint"
    assert (doc["job"], doc["root"], doc["batch_id"]) == ("job", b.catalog.uri, latest.batch_id)
    [op] = doc["operators"]
    assert {"id", "name", "partitions", "stores"} <= set(op) and op["partitions"] == SHUFFLE_PARTITIONS
    assert [(s["name"], s["rows"]) for s in op["stores"]] == [  # state variables in name order
        ("alerts", state_cases.row_count(b.case.expected["alerts"])),
        ("over_limit", state_cases.row_count(b.case.expected["over_limit"]))]
    assert all({"name", "rows", "key_schema", "value_schema"} <= set(s) for s in op["stores"])
    assert "rows" not in doc

    code, out, err = _cli(capsys, "inspect", "--dir", str(b.root), "--job", "job", "savepoints/" +
                          b.savepoint.uri.rsplit("/", 1)[1], "--json", "--rows", "--store", "alerts",
                          "--key", '{"sensor": "s0"}', "--limit", "5")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["operator"], doc["store"]) == (0, "alerts")
    assert (doc["rows"]
            == [{"key": {"sensor": "s0"}, "value": {"count": b.case.expected["alerts"][(("s0",), None)][0]},
                 "partition": doc["rows"][0]["partition"]}])

    code, out, err = _cli(capsys, "inspect", "--dir", str(b.root), "--job", "job", b.savepoint.uri, "--rows",
                          "--limit", "1")
    assert code == 0, err
    assert "over_limit" in out and "alerts" in out and "transformWithStateInPandasExec" in out
    assert len([line for line in out.splitlines() if " -> " in line]) == 1  # --limit 1


def test_cli_inspect_bad_input_fails_before_reading(built, tmp_path, capsys):
    b = built("aggregation")
    base = ["inspect", "--dir", str(b.root), "--job", "job"]
    code, _, err = _cli(capsys, *base, "latest", "--rows", "--key", "{user")
    assert code == 2 and "--key '{user' is not JSON" in err
    code, _, err = _cli(capsys, *base, "latest", "--store", "default")
    assert code == 2 and "need --rows" in err
    code, _, err = _cli(capsys, *base, "latest", "--rows", "--operator", "4")
    assert code == 2 and "operator 4 is not in" in err
    code, _, err = _cli(capsys, *base, "latest", "--rows", "--limit", "0")
    assert code == 2 and "'0' is invalid" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _cli(capsys, "inspect", "--dir", str(tmp_path / "empty"), "--job", "job", "latest")
    assert code == 1 and "no completed checkpoint" in err
    code, _, err = _cli(capsys, *base, str(tmp_path / "nothing-here"))
    assert code == 1 and "has no _metadata" in err


def test_state_ttl_expired_keys_disappear_from_the_row_counts(spark, tmp_path):
    """transformWithState TTL (PySpark: ``ttlDurationMs``; processing-time mode) is
    measured against the micro-batch's processing time: state written by run 1 expires
    once a later batch starts more than the TTL after it, and that batch removes it.
    Run 1 leaves state for three sensors in one batch; run 2, started after the TTL,
    touches s0 and s2 only: inspect must then count exactly run 2's state (s0's earlier
    state expired too, so its streak and alert count start over; s1's and s3's are gone)."""
    ttl_ms = 3000
    first = [row for row in state_cases.threshold_files()[0] + state_cases.threshold_files()[1]]
    second = [{"sensor": s, "ts": state_cases.ts(20 + i), "value": v}
              for i, (s, v)
              in enumerate([("s0", 95.0), ("s0", 96.0), ("s0", 97.0), ("s0", 98.0), ("s2", 99.0)])]
    case = Case(state_cases.threshold_query(state_ttl_ms=ttl_ms, files_per_batch=10), [first, second],
                {"mode": "append"}, "append", "transformWithStateInPandasExec")
    root, inputs, table = str(tmp_path / "root"), tmp_path / "input", tmp_path / "table"
    write_json_batches(inputs, [first])
    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    previous = spark.conf.get(key)
    spark.conf.set(key, "false")  # as threshold_alerts.py does under availableNow with a TTL
    try:
        state_cases.run_case(spark, case, root, "job", inputs, table)
        catalog = Catalog.open(root, "job")
        after_first = inspect_snapshot(spark, "latest", catalog=catalog)
        stores = {s.name: s for s in after_first.operators[0].stores}
        over, alerts = state_cases.threshold_state([first])
        assert stores["over_limit"].ttl and stores["alerts"].ttl and after_first.operators[0].time_mode == \
            "ProcessingTime"
        assert {k[0][0] for k in over} == {"s0", "s3"} and {k[0][0] for k in alerts} == {"s0", "s1"}
        assert (stores["over_limit"].keys, stores["alerts"].keys) == (len(over), len(alerts))

        time.sleep(ttl_ms / 1000 + 1)  # the next batch's processing time is past every expiry
        write_json_batches(inputs, [second], start=1)
        started_ms = time.time() * 1000
        state_cases.run_case(spark, case, root, "job", inputs, table)
        ended_ms = time.time() * 1000
    finally:
        spark.conf.set(key, previous)

    over, alerts = state_cases.threshold_state([second])  # run 1's state expired: only run 2 counts
    assert over == {(("s0",), None): [(state_cases.json_ts(23), 98.0)], (("s2",), None): [
        # without TTL s0 would be at 2
        (state_cases.json_ts(24), 99.0)]} and alerts == {(("s0",), None): (1,)}
    state = inspect_snapshot(spark, "latest", catalog=catalog)
    stores = {s.name: s for s in state.operators[0].stores}
    assert (stores["over_limit"].rows, stores["over_limit"].keys) == (2, 2)
    assert (stores["alerts"].rows, stores["alerts"].keys) == (1, 1)
    with open_state(spark, "latest", catalog=catalog) as snap:
        rows = rows_as_json(snap.rows(store="over_limit"))
        assert state_cases.observed(rows, "list") == over
        counts = rows_as_json(snap.rows(store="alerts"))
        assert state_cases.observed(counts, "value") == alerts
    for row in rows + counts:  # expiry = the writing batch's processing time + TTL
        assert started_ms + ttl_ms - 1000 <= row["ttl_expiration_ms"] <= ended_ms + ttl_ms


@pytest.mark.s3
def test_snapshot_on_s3_inspected_by_the_console_script_in_a_fresh_process(
    spark, s3_server, s3_bucket, tmp_path, capsys
):
    from airflow_sparkpoint.checkpoints.verification import read_verification

    case = state_cases.threshold_case()
    inputs = tmp_path / "input"
    write_json_batches(inputs, case.files)
    root = f"s3://{s3_bucket}/sp"
    result = state_cases.run_case(spark, case, root, "alerts", inputs, tmp_path / "table", conf={
        "spark.sparkpoint.s3.endpoint": s3_server, "spark.sparkpoint.s3.region": "us-east-1",
        "spark.sparkpoint.workDir": str(tmp_path / "work")})
    assert result.status == "finished"
    options = {"endpoint_url": s3_server, "region_name": "us-east-1"}
    catalog = Catalog.open(root, "alerts", **options)
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))
    assert savepoint.uri.startswith("s3://")

    env = {**os.environ, "SPARKPOINT_S3_ENDPOINT": s3_server, "SPARKPOINT_S3_REGION": "us-east-1"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "sparkpoint"), "inspect", "--dir", root, "--job", "alerts",
         savepoint.uri, "--json", "--rows", "--store", "over_limit", "--limit", "100"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    [op] = doc["operators"]
    assert {s["name"]: s["rows"] for s in op["stores"]} == {
        name: state_cases.row_count(rows) for name, rows in case.expected.items()}
    assert state_cases.observed(doc["rows"], "list") == case.expected["over_limit"]

    code = cli.main(["verify", "--dir", root, "--job", "alerts", savepoint.uri, "--s3-endpoint", s3_server,
                     "--s3-region", "us-east-1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["ok"] and outcome["checks"]["rows"] == sum(
        state_cases.row_count(rows) for rows in case.expected.values())
    record = read_verification(catalog.store, savepoint.uri[len(catalog.uri) + 1:])  # on S3, next to it
    assert record is not None and record.ok and record.verified_at == outcome["verified_at"]
