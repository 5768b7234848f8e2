"""Inspect, verify, rescale and restore drills with the job's storage on S3
(``spark.sparkpoint.dir = s3://...``), against a real S3 server over HTTP: moto in a
child process by default, SeaweedFS too (``slow``). Every oracle is computed from the
input in plain Python (`tests/support/rescale_runs.py`, `tests/support/state_cases.py`).

* rescale: a savepoint taken with 4 state partitions is restored into 8 by a
  ``spark-submit`` that is SIGKILLed during the repartition (fault point ``rescale``;
  the test proves it fired there), which leaves the savepoint's objects and the sink
  byte-for-byte unchanged; the retry rescales 4 -> 8, a later restore 8 -> 2; totals
  exact after each, ``list --json`` and ``inspect`` show the new partition count and
  the state rows equal the oracle;
* ``sparkpoint inspect`` of a transformWithState savepoint (value, list and map state):
  operators, partitions, row counts and ``--rows`` equal the oracle, the savepoint's
  objects unchanged;
* ``sparkpoint verify`` records ``verified_at`` next to the snapshot on S3 (``list
  --json`` shows it); a copy with one flipped byte fails, exit 1, ``verify_error`` set;
* `SparkpointVerifyOperator` (``dag.test()``) drills the newest savepoint of a job on S3
  with its scratch root on S3 too, as taken and rescaled (``state_partitions=3``):
  the drill's alerts are exactly those the input after the savepoint raises on top of
  its state, the outcome is recorded on the production savepoint, and the production
  job's objects (but that record), generations and sink are untouched.

The sinks are local Delta tables (the Delta sink on S3 has its own tests). About 5
``spark-submit`` runs per server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.verification import read_verification
from airflow_sparkpoint.demo.support import delta_commits
from airflow_sparkpoint.runtime.rescale import interrupted
from tests.support import state_cases
from tests.support.dag_runs import new_dag, run_dag
from tests.support.inputs import sorted_delta_rows, write_json_batches
from tests.support.paths import REPO
from tests.support.rescale_runs import (
    JOB,
    expected,
    finished,
    first_run,
    offsets_conf,
    submit,
    table,
    write_inputs,
)
from tests.support.s3_servers import S3Context, new_bucket

pytestmark = [pytest.mark.spark, pytest.mark.s3]

THRESHOLD_SCRIPT = REPO / "dags" / "jobs" / "threshold_alerts.py"


@pytest.fixture(scope="module", params=["moto", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def server(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(name, endpoint) of the S3 server: moto in a child process (this process reads S3
    while Spark and delta-rs run here too), or SeaweedFS."""
    fixture = "s3_server_process" if request.param == "moto" else "seaweedfs_server"
    return request.param, str(request.getfixturevalue(fixture))


@pytest.fixture()
def s3(server: tuple[str, str]) -> S3Context:
    """A fresh bucket on the server."""
    name, endpoint = server
    return new_bucket(endpoint, name)


class Root:
    """A job root on S3 and how each client reaches it: the Spark conf of a driver (its
    live location is a local `work` directory, as S3 roots require), the options of
    `Catalog`/`open_storage`, the CLI's flags."""

    def __init__(self, s3: S3Context, work: Path, job: str, prefix: str = "sp") -> None:
        self.s3, self.job = s3, job
        self.uri = f"s3://{s3.bucket}/{prefix}"
        self.conf = {"spark.sparkpoint.dir": self.uri, "spark.sparkpoint.workDir": str(work), **s3.conf()}
        self.flags = ["--s3-endpoint", s3.endpoint, "--s3-region", "us-east-1"]

    @property
    def catalog(self) -> Catalog:
        return Catalog.open(self.uri, self.job, **self.s3.options())

    def record(self, snapshot_uri: str) -> Any:
        """The verification record next to the snapshot (read from S3), or None."""
        catalog = self.catalog
        return read_verification(catalog.store, snapshot_uri[len(catalog.uri) + 1:])

    def key_of(self, uri: str) -> str:
        """The object key (prefix) of `uri` in the bucket."""
        assert uri.startswith(f"s3://{self.s3.bucket}/"), uri
        return uri[len(f"s3://{self.s3.bucket}/"):]

    def digest(self, uri: str) -> dict[str, str]:
        """Every object under `uri` with its sha256: proves nothing was written or changed."""
        client, prefix = self.s3.client(), self.key_of(uri).rstrip("/") + "/"
        digests = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=self.s3.bucket, Key=obj["Key"])["Body"].read()
                digests[obj["Key"][len(prefix):]] = hashlib.sha256(body).hexdigest()
        return digests

    def cli(self, capsys: pytest.CaptureFixture[str], command: str, *argv: str) -> tuple[int, Any, str]:
        """``sparkpoint <command> --dir --job <S3 flags> argv --json``: (exit code, JSON, stderr)."""
        capsys.readouterr()
        code = cli.main([command, "--dir", self.uri, "--job", self.job, *self.flags, *argv, "--json"])
        out, err = capsys.readouterr()
        return code, json.loads(out) if out.strip() else None, err

    def listed(self, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
        """``list --json``: every checkpoint and savepoint by URI."""
        code, doc, err = self.cli(capsys, "list")
        assert code == 0, err
        return {e["uri"]: e for e in doc["checkpoints"] + doc["savepoints"]}


def savepoint_of_latest(root: Root) -> SnapshotHandle:
    catalog = root.catalog
    latest = catalog.latest()
    assert latest is not None
    savepoint = catalog.create_savepoint(catalog.handle(latest))
    assert savepoint.uri.startswith(f"{root.uri}/"), savepoint.uri
    return savepoint


def table_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ rescale


def inspected_totals(root: Root, capsys: pytest.CaptureFixture[str],
                     target: str) -> tuple[int, dict[str, Any]]:
    """(partitions, {user: (sum, count)}) of the aggregation state `inspect --rows` reads."""
    code, doc, err = root.cli(capsys, "inspect", target, "--rows", "--limit", "1000")
    assert code == 0, err
    [op] = doc["operators"]
    assert [s["rows"] for s in op["stores"]] == [len(doc["rows"])]
    return op["partitions"], {r["key"]["user"]: (r["value"]["sum"], r["value"]["count"]) for r in doc["rows"]}


# slow: about a minute; the rescale and its kill are in the default run on local storage (test_rescale)
@pytest.mark.slow
def test_rescale_on_s3_killed_then_up_and_down_exactly(s3, spark, tmp_path, capsys):
    """4 -> 8 from a savepoint (the first try killed during the repartition), then 8 -> 2
    from the latest checkpoint: exact totals, the savepoint's objects never change."""
    root = Root(s3, tmp_path / "work", JOB)
    first_run(spark, tmp_path, "aggregation", files=3, partitions=4, conf=root.conf)
    assert root.catalog.latest().state_partitions == 4
    savepoint = savepoint_of_latest(root)
    savepoint_before = root.digest(savepoint.uri)
    state_keys = {ref.key for ref in savepoint.metadata.files if ref.path.startswith("state/")}
    assert state_keys and state_keys <= set(savepoint_before), "the savepoint's state is not under it"
    restored = savepoint.metadata.batch_id
    synthetic = restored + 1  # the repartitioner's batch: no input, never staged
    write_inputs(tmp_path / "input", 3, 5)
    table_before = table_digest(tmp_path / "out")
    checkpoints_before = [e.id for e in root.catalog.list_checkpoints()]

    # SIGKILL (spark-submit's JVM and the Python driver) during the repartition.
    marker = tmp_path / "fault-fired"
    rescale = {"spark.sparkpoint.restore": savepoint.uri, "spark.sparkpoint.restore.statePartitions": "8"}
    killed = submit(tmp_path, "aggregation", {**root.conf, **rescale},
                    env={"SPARKPOINT_TEST_FAULT": f"rescale:{restored}",
                         "SPARKPOINT_TEST_FAULT_ONCE": str(marker)})
    assert killed.returncode != 0 and killed.result is None, killed.tail()
    assert marker.read_text().strip() == f"rescale:{restored}", "the fault point was not reached"
    killed_origin = root.catalog.origins()[-1]
    assert killed_origin.generation == 2 and killed_origin.live_dir, killed_origin
    live = Path(killed_origin.live_dir)
    assert offsets_conf(str(live), synthetic)["spark.sql.shuffle.partitions"] == "8", \
        "killed before the repartitioner started"
    if not (live / "commits" / str(synthetic)).exists():  # killed before Spark's commit, as intended
        assert interrupted(str(live), restored)
    assert root.digest(savepoint.uri) == savepoint_before, "the killed rescale modified the savepoint"
    assert table_digest(tmp_path / "out") == table_before, "the killed rescale touched the sink"
    assert [e.id for e in root.catalog.list_checkpoints()] == checkpoints_before
    assert root.catalog.transactions() == []

    # The retry: the same submit, not killed.
    up = finished(submit(tmp_path, "aggregation", {**root.conf, **rescale}))
    assert up["restored_from"] == savepoint.uri and up["live_dir"] != str(live)
    assert up["rescaled"] == {"from": 4, "to": 8, "batch": synthetic}
    assert (up["first_batch"], up["last_batch"]) == (synthetic + 1, synthetic + 2), up
    assert table(tmp_path / "out") == expected(5)
    commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
    assert commits == [0, 1, 2, synthetic + 1, synthetic + 2], commits
    latest = root.catalog.latest()
    assert latest is not None and latest.batch_id == synthetic + 2 and latest.state_partitions == 8
    assert offsets_conf(up["live_dir"], synthetic + 2)["spark.sql.shuffle.partitions"] == "8"
    listed = {e["batch_id"]: e for e in root.listed(capsys).values() if e["uri"] != savepoint.uri}
    assert listed[synthetic + 2]["state_partitions"] == 8 and listed[synthetic]["state_partitions"] == 8
    assert inspected_totals(root, capsys, "latest") == (8, expected(5))
    assert root.digest(savepoint.uri) == savepoint_before, "the savepoint was modified (NO_CLAIM)"

    # Down: the latest checkpoint (8 partitions) restored into 2, two more files.
    write_inputs(tmp_path / "input", 5, 7)
    down = finished(submit(tmp_path, "aggregation",
                           {**root.conf, "spark.sparkpoint.restore.statePartitions": "2"}))
    second = synthetic + 3  # the second rescale's synthetic batch
    assert down["rescaled"] == {"from": 8, "to": 2, "batch": second}
    assert (down["first_batch"], down["last_batch"]) == (second + 1, second + 2), down
    assert table(tmp_path / "out") == expected(7)
    commits = [c["batch"] for c in delta_commits(tmp_path / "out")]
    assert commits[-2:] == [second + 1, second + 2] and synthetic not in commits and second not in commits
    assert len(commits) == len(set(commits)), commits
    latest = root.catalog.latest()
    assert latest is not None and latest.state_partitions == 2
    listed = {e["batch_id"]: e for e in root.listed(capsys).values() if e["uri"] != savepoint.uri}
    assert listed[second + 2]["state_partitions"] == 2
    assert inspected_totals(root, capsys, "latest") == (2, expected(7))
    assert root.digest(savepoint.uri) == savepoint_before


# ------------------------------------------------------------------ inspect and verify


class Built:
    def __init__(self, root: Root, case: state_cases.Case, savepoint: SnapshotHandle) -> None:
        self.root, self.case, self.savepoint = root, case, savepoint


@pytest.fixture(scope="module")
def keyed_state(server: tuple[str, str], spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The transformWithState case (value, list and map state) run on S3 in its own
    bucket, and a savepoint (once per module and server: inspect and verify share it)."""
    case = state_cases.keyed_state_case()
    tmp_path = tmp_path_factory.mktemp("keyed-state-s3")
    root = Root(new_bucket(server[1], server[0]), tmp_path / "work", "totals")
    write_json_batches(tmp_path / "input", case.files)
    result = state_cases.run_case(spark, case, root.uri, root.job, tmp_path / "input", tmp_path / "table",
                                  conf=root.conf)
    assert result.status == "finished"
    return Built(root, case, savepoint_of_latest(root))


def test_inspect_on_s3_reads_back_exactly_the_state_the_pipeline_put_in(keyed_state, capsys):
    b = keyed_state
    before = b.root.digest(b.root.uri)
    name = b.savepoint.uri.rsplit("/", 1)[1]

    code, doc, err = b.root.cli(capsys, "inspect", b.savepoint.uri)
    assert code == 0, err
    assert (doc["uri"], doc["batch_id"]) == (b.savepoint.uri, b.savepoint.metadata.batch_id)
    [op] = doc["operators"]
    # the session's shuffle partitions
    assert (op["id"], op["name"], op["partitions"]) == (0, b.case.operator, 2)
    assert {s["name"]: s["rows"] for s in op["stores"]} == {
        store: state_cases.row_count(rows) for store, rows in b.case.expected.items()}
    for store, store_type in b.case.types.items():
        code, doc, err = b.root.cli(capsys, "inspect", f"savepoints/{name}", "--rows", "--store", store,
                                    "--limit", "1000")
        assert code == 0, err
        assert state_cases.observed(doc["rows"], store_type) == b.case.expected[store], store
    assert b.root.digest(b.root.uri) == before, "inspect wrote to the job's root"


def test_verify_on_s3_records_the_outcome_and_fails_on_a_corrupted_object(keyed_state, capsys):
    b = keyed_state
    root, meta = b.root, b.savepoint.metadata
    code, doc, err = root.cli(capsys, "verify", b.savepoint.uri)
    assert code == 0, err
    assert doc["ok"] and doc["error"] is None
    assert doc["checks"]["partitions"] == 2 and doc["checks"]["files"] == len(meta.files)
    assert doc["checks"]["rows"] == sum(state_cases.row_count(rows) for rows in b.case.expected.values())
    record = root.record(b.savepoint.uri)
    assert (record is not None and record.ok and record.level == "state"
            and record.verified_at == doc["verified_at"])
    entry = root.listed(capsys)[b.savepoint.uri]
    assert entry["valid"] and (entry["verified_at"], entry["verify_error"]) == (doc["verified_at"], None)

    # A copy of the savepoint among the job's savepoints with one byte of a state file flipped.
    client, bucket = root.s3.client(), root.s3.bucket
    source = root.key_of(b.savepoint.uri)
    copy = f"{source.rsplit('/', 1)[0]}/savepoint-{meta.id}-flipped"
    for key in root.digest(b.savepoint.uri):
        client.copy_object(Bucket=bucket, Key=f"{copy}/{key}",
                           CopySource={"Bucket": bucket, "Key": f"{source}/{key}"})
    ref = max((r for r in meta.files if r.path.startswith("state/0/")), key=lambda r: r.size)
    data = client.get_object(Bucket=bucket, Key=f"{copy}/{ref.key}")["Body"].read()
    client.put_object(Bucket=bucket, Key=f"{copy}/{ref.key}", Body=data[:-1] + bytes([data[-1] ^ 0x01]))
    copy_uri = f"s3://{bucket}/{copy}"
    copied = client.get_object(Bucket=bucket, Key=f"{copy}/_metadata")["Body"].read()
    assert SnapshotMetadata.from_bytes(copied).files == meta.files

    code, doc, err = root.cli(capsys, "verify", copy_uri)
    assert code == 1 and doc["ok"] is False
    assert f"{ref.key} is corrupt: its sha256 is" in doc["error"] and doc["error"] in err
    entry = root.listed(capsys)[copy_uri]
    assert (entry["verified_at"], entry["verify_error"]) == (doc["verified_at"], doc["error"])
    assert root.listed(capsys)[b.savepoint.uri]["verify_error"] is None, \
        "the healthy savepoint's record changed"


# ------------------------------------------------------------------ restore drills


def alert_rows(files: list[list[dict[str, Any]]], start: int) -> list[dict[str, Any]]:
    """The alerts files `start`.. raise (oracle), as the Delta table returns them."""
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    alerts = [a for batch in state_cases.threshold_alerts(files)[start:] for a in batch]
    return sorted(({**a, "first_ts": parse(a["first_ts"]), "last_ts": parse(a["last_ts"])} for a in alerts),
                  key=lambda r: json.dumps(r, sort_keys=True, default=str))


class Production:
    """The threshold pipeline (``dags/jobs/threshold_alerts.py``'s query) on S3 after the
    first two files, a savepoint, and two more files written since."""

    def __init__(self, s3: S3Context, spark: Any, base: Path) -> None:
        self.base, self.files = base, state_cases.threshold_files()
        self.root = Root(s3, base / "work", "alerts")
        self.input, self.output = base / "readings", base / "alerts"
        write_json_batches(self.input, self.files[:2])
        case = state_cases.threshold_case()
        result = state_cases.run_case(spark, case, self.root.uri, self.root.job, self.input, self.output,
                                      conf=self.root.conf)
        assert result.status == "finished" and result.last_batch == 1
        self.savepoint = savepoint_of_latest(self.root)
        write_json_batches(self.input, self.files[2:], start=2)
        # s0's streak (98 | 99, 91) spans the savepoint: it alerts only if the state was restored
        assert any(a["sensor"] == "s0" and a["first_ts"] < state_cases.ts(4)  # (file 2 starts at minute 4)
                   for a in state_cases.threshold_alerts(self.files)[2])

    def drill(self, base: Path, **kwargs: Any) -> Any:
        """`SparkpointVerifyOperator` of the newest savepoint with its scratch root on S3;
        returns the DAG run."""
        from airflow_sparkpoint.operators import SparkpointVerifyOperator

        with new_dag("drill_s3") as dag:
            SparkpointVerifyOperator(
                task_id="drill", job_name=self.root.job, checkpoint_dir=self.root.uri,
                sparkpoint_conn_id="sp_s3",
                snapshot="latest_savepoint", drill_dir=f"s3://{self.root.s3.bucket}/drills",
                work_dir=str(base / "drill-work"), application=str(THRESHOLD_SCRIPT),
                application_args=["--input", str(self.input), "--output", str(self.output), "--limit",
                                  str(state_cases.LIMIT), "--readings", str(state_cases.READINGS)],
                output_args={"--output": str(base / "drill-alerts")}, conn_id="spark_default",
                conf={"spark.ui.enabled": "false", "spark.log.level": "WARN"}, **kwargs)
        return run_dag(dag)


@pytest.fixture()
def production(s3: S3Context, spark: Any, tmp_path: Path, airflow_home: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[Production]:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_SP_S3", json.dumps({"conn_type": "sparkpoint", "extra": {
        "endpoint_url": s3.endpoint, "region_name": "us-east-1"}}))
    yield Production(s3, spark, tmp_path / "production")


# slow: about a minute; the drill is in the default run on local storage (test_verify_operator)
@pytest.mark.slow
@pytest.mark.airflow
def test_drills_on_s3_as_taken_and_rescaled_record_on_the_savepoint_and_leave_production_alone(
    production, tmp_path, capsys
):
    """The same savepoint drilled twice (one production run for both): as taken, then
    rescaled from 2 into 3 state partitions (``state_partitions=3``)."""
    prod = production
    root, savepoint = prod.root, prod.savepoint
    generations = root.catalog.current_generation()
    table_before = sorted_delta_rows(prod.output)
    objects_before = root.digest(root.uri)
    record_key = f"{root.key_of(savepoint.uri)[len(root.key_of(root.uri)) + 1:]}/_verification.json"
    assert record_key not in objects_before
    batch = savepoint.metadata.batch_id

    for state_partitions in (None, 3):
        base = tmp_path / f"drill-{state_partitions or 'as-taken'}"
        base.mkdir()
        run = prod.drill(base, **({"state_partitions": state_partitions} if state_partitions else {}))

        assert run.state == "success", {t.task_id: t.state for t in run.get_task_instances()}
        [ti] = run.get_task_instances()
        summary = ti.xcom_pull(task_ids="drill")
        assert summary["ok"] and (summary["snapshot"], summary["batch_id"]) == (savepoint.uri, batch)
        result = summary["result"]
        assert ((result["job"], result["generation"], result["restored_from"])
                == ("alerts-drill", 1, savepoint.uri))
        if state_partitions:  # the repartitioner's batch (no input) comes first
            assert result["rescaled"] == {"from": 2, "to": 3, "batch": batch + 1}
            assert (result["first_batch"], result["batches_processed"]) == (batch + 2, 2)
        else:
            assert (not result["rescaled"]
                    and (result["first_batch"], result["batches_processed"]) == (batch + 1, 2))
        assert sorted_delta_rows(base / "drill-alerts") == alert_rows(prod.files, 2), state_partitions
        # recorded next to the production savepoint, on S3
        record = root.record(savepoint.uri)
        assert record is not None and record.ok and record.level == "drill"
        assert record.verified_at == summary["verified_at"] and record.checks["batches_processed"] == 2
        assert record.checks.get("rescaled") == (result["rescaled"] if state_partitions else None)
        entry = root.listed(capsys)[savepoint.uri]
        assert (entry["verified_at"], entry["verify_error"]) == (record.verified_at, None)
        # production untouched: generations, sink, objects (but the record); no scratch left on S3
        assert root.catalog.current_generation() == generations == 1
        assert sorted_delta_rows(prod.output) == table_before
        objects_after = root.digest(root.uri)
        assert set(objects_after) - set(objects_before) == {record_key}
        assert {k: v for k, v in objects_after.items() if k != record_key} == objects_before
        assert root.digest(f"s3://{root.s3.bucket}/drills") == {}, "the drill's scratch root was left on S3"
