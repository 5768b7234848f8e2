"""The example DAGs of ``dags/``, end to end: every DAG runs with `dag.test()` against
local Spark through real ``spark-submit``, including its failure branches, and the
Delta tables are checked exactly against results computed here from the input.

* incremental ETL: the first try's driver is SIGKILLed, the retry resumes; the next
  scheduled run only reads the new input;
* write-audit-publish: a clean run is published; a run with a bad row is discarded;
* scheduled savepoints: four runs against a running job, history retention keeps three;
* blue-green: a healthy green passes the pre-flight and is published; a failing green
  and a rejected one (pre-flight skipped by its param) are rolled back to blue from the
  same savepoint and never show in the table;
* write-audit-publish on S3 (moto's server) through a ``sparkpoint`` connection with an
  endpoint and credentials: the audit reads the staged rows through the hook.

The DAG files carry production settings only: storage comes from the
``sparkpoint_default`` connection (pointed at each test's directory or bucket through
``AIRFLOW_CONN_SPARKPOINT_DEFAULT``), Spark settings from ``spark-defaults.conf``
(``SPARK_CONF_DIR``: two shuffle partitions, no UI, here), paths from DAG params.

Long-running jobs (blue, the alerting job) run as their own ``spark-submit`` processes
(`dag.test()` runs tasks one at a time; `airflow_sparkpoint.demo.support.SubmittedJob`,
which `sparkpoint demo` uses too). They are all started together, once, by the
first test that needs one, and are killed at the end of the module at the latest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.demo.support import (
    SubmittedJob,
    delta_commits,
    delta_rows,
    orphaned_staged_files,
    write_batch_file,
)
from airflow_sparkpoint.storage import open_storage
from tests.support.paths import REPO
from tests.support.triggers import idle_trigger

pytestmark = pytest.mark.airflow

#: the example DAG's zero-downtime path, skipped on the stop-savepoint-start path
ZERO_DOWNTIME_SKIPPED = {t: "skipped" for t in (
    "preflight_zero_downtime", "start_green_zero_downtime", "cutover", "blue_stopped",
    "restore_blue_after_cutover", "cutover_called_off")}

DAGS = REPO / "dags"
JOBS = DAGS / "jobs"
SPARK_DEFAULTS = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN"}
EXAMPLES = {
    "example_sparkpoint_incremental_etl",
    "example_sparkpoint_blue_green",
    "example_sparkpoint_scheduled_savepoints",
    "example_sparkpoint_write_audit_publish",
    "example_sparkpoint_restore_drill",  # run in test_verify_operator.py
    "example_sparkpoint_health",  # run in tests/unit/airflow/test_health_operator.py
    "example_sparkpoint_on_committed_alerts",  # watchers: tests/e2e/test_e2e_assets.py
    "example_sparkpoint_on_savepoint",
}
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def spark_conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Test tuning lives in spark-defaults.conf, as a cluster's does, not in the DAGs."""
    conf_dir = tmp_path_factory.mktemp("spark-conf")
    (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items()))
    return conf_dir


@pytest.fixture(autouse=True)
def _spark_connection(airflow_home: Path, spark_conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("SPARK_CONF_DIR", str(spark_conf_dir))
    monkeypatch.delenv("SPARKPOINT_WORK_DIR", raising=False)


def use_storage(monkeypatch: pytest.MonkeyPatch, root: Path | str, **extra: Any) -> None:
    """Point the DAGs' ``sparkpoint_default`` connection at `root`."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARKPOINT_DEFAULT",
                       json.dumps({"conn_type": "sparkpoint", "host": str(root), **extra}))


# ---------------------------------------------------------------------------- helpers


def iso(minute: float) -> str:
    return utc(T0 + timedelta(minutes=minute))


def utc(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def assert_each_batch_committed_once(path: Path | str) -> list[dict[str, Any]]:
    commits = delta_commits(path)
    batches = [c["batch"] for c in commits]
    assert len(batches) == len(set(batches)), f"a batch was committed twice: {commits}"
    return commits


def catalog(root: Path | str, job: str) -> Catalog:
    return Catalog(open_storage(str(root)), job)


@pytest.fixture(scope="module")
def dagbag(airflow_home: Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS))


def run_dag(dagbag: Any, dag_id: str, **conf: Any) -> Any:
    """`dag.test()` one run of a freshly parsed DAG (a run's conf is merged into the
    params of the DAG object it ran, so a DAG object is never run twice)."""
    from airflow.dag_processing.dagbag import DagBag

    fileloc = dagbag.get_dag(dag_id).fileloc
    dag = DagBag(fileloc).get_dag(dag_id)
    assert dag is not None, f"{dag_id} not found in {fileloc}"
    return dag.test(run_conf=conf)


def task_states(run: Any) -> dict[str, str | None]:
    return {ti.task_id: (str(ti.state) if ti.state else None) for ti in run.get_task_instances()}


def task_instance(run: Any, task_id: str) -> Any:
    [ti] = [t for t in run.get_task_instances() if t.task_id == task_id]
    return ti


def xcom(run: Any, task_id: str, key: str = "return_value") -> Any:
    return task_instance(run, task_id).xcom_pull(task_ids=task_id, key=key)


# ---------------------------------------------------------------------------- long-running jobs


# Blue reads its whole backlog in its first micro-batch, then idles until its next
# trigger (weeks away, `idle_trigger`): the input written afterwards is left for green,
# whatever the timing of the test. The stop request still arrives within the control poll interval.
BLUE_TRIGGER = idle_trigger()

BLUE = ("keyed_totals.py", BLUE_TRIGGER, ["--version", "1", "--files-per-batch", "100"])
# What each test needs running in the background (started together, once):
# test -> (job name, (job script, trigger, arguments)).
BACKGROUND = {
    "test_blue_green_publishes_a_healthy_green": ("bg_publish", BLUE),
    "test_blue_green_rolls_back_a_failing_green": ("bg_failing", BLUE),
    "test_blue_green_rolls_back_a_rejected_green": ("bg_rejected", BLUE),
    "test_scheduled_savepoints_of_a_running_job": (
        "sensor_alerts", ("threshold_alerts.py", "processingTime:1s", ["--limit", "90", "--readings", "3"])),
}


@pytest.fixture(scope="module", autouse=True)
def background(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SubmittedJob]]:
    """The long-running jobs of the selected tests, keyed by test name, with their
    first input written and the processes started when the module starts: their start-up
    overlaps with each other and with the tests that run before them."""
    selected = {item.originalname for item in request.session.items
                if getattr(item, "module", None) is request.module}
    jobs: dict[str, SubmittedJob] = {}
    try:
        for test, (job_name, (script, trigger, args)) in BACKGROUND.items():
            if test not in selected:
                continue
            job = SubmittedJob(tmp_path_factory.mktemp(job_name), JOBS / script, job_name, trigger, args)
            if script == "keyed_totals.py":
                for index, users in enumerate(BLUE_FILES):
                    write_batch_file(job.input, index, totals_rows(index, users))
            else:
                for index in range(2):
                    write_batch_file(job.input, index, readings(index))
            job.start()
            jobs[test] = job
        yield jobs
    finally:
        for job in jobs.values():
            job.kill()


def background_job(background: dict[str, Any], request: pytest.FixtureRequest) -> SubmittedJob:
    job: SubmittedJob = background[request.node.originalname]
    return job


# ---------------------------------------------------------------------------- every DAG imports


def test_every_example_dag_imports_and_job_scripts_are_not_dag_files(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert EXAMPLES <= set(dagbag.dag_ids)
    parsed = {Path(stat.file).as_posix() for stat in dagbag.dagbag_stats}
    jobs = sorted(p.name for p in JOBS.glob("*.py"))
    assert {"keyed_totals.py", "threshold_alerts.py", "dedup_events.py", "windowed_counts.py"} <= set(jobs)
    wrongly_parsed = [p for p in parsed if "jobs/" in p or Path(p).name in jobs]
    assert not wrongly_parsed, f"job scripts parsed as DAG files: {wrongly_parsed}"
    for name in jobs:  # they would be parsed (and run) without dags/.airflowignore
        text = (JOBS / name).read_text()
        assert 'if __name__ == "__main__":' in text, f"{name} must only run under spark-submit"

    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    for dag_id in sorted(EXAMPLES):
        dag = dagbag.get_dag(dag_id)
        assert dag.doc_md and "sparkpoint" in dag.tags, dag_id
        source = Path(dag.fileloc).read_text()
        for tuning in ("/tmp", "shuffle.partitions", "spark.ui.enabled", "xcom_pull(task_ids='", "{{ ti."):
            assert tuning not in source, \
                f"{dag_id}: {tuning!r} (test tuning or a Jinja XCom string) in the DAG"
        assert "current_generation()" not in source, f"{dag_id} races on the newest generation"
        for task in dag.tasks:
            where = f"{dag_id}.{task.task_id}"
            if hasattr(task, "job_name"):
                assert task.sparkpoint_conn_id == "sparkpoint_default" and not task.checkpoint_dir, where
            if isinstance(task, SparkpointSubmitOperator):
                assert not task.conf and task._conn_id == "spark_default", where
                assert Path(task.application).parent == JOBS and Path(task.application).exists()


# ---------------------------------------------------------------------------- incremental ETL


def page_views(index: int) -> list[dict[str, Any]]:
    """Four views of two pages, every two minutes, seven minutes apart per file."""
    return [{"page": page, "ts": iso(index * 7 + j * 2), "user": f"u{j}"} for j in range(4)
            for page in ("/home", "/cart")]


def expected_windows(files: int) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for index in range(files):
        for view in page_views(index):
            ts = datetime.strptime(view["ts"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
            start = ts.replace(minute=ts.minute - ts.minute % 10, second=0)
            key = (start.isoformat(), view["page"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def window_rows(table: Path) -> dict[tuple[str, str], int]:
    rows = delta_rows(table)
    got = {(r["window_start"].astimezone(timezone.utc).isoformat(), r["page"]): r["views"] for r in rows}
    assert len(got) == len(rows), "duplicate (window, page) rows"
    for row in rows:
        assert row["window_end"] - row["window_start"] == timedelta(minutes=10)
    return got


# slow: about 1.5 minutes; a retry that resumes is in the default run (test_quickstart_dag, tests/e2e)
@pytest.mark.slow
@pytest.mark.spark
def test_incremental_etl_retry_resumes_from_the_latest_checkpoint(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = 4
    for index in range(files):
        write_batch_file(tmp_path / "input", index, page_views(index))
    use_storage(monkeypatch, tmp_path / "checkpoints")
    paths = {"input": str(tmp_path / "input"), "output": str(tmp_path / "views")}
    # The first try's driver is SIGKILLed once batch 1 is confirmed, before its checkpoint.
    monkeypatch.setenv("SPARKPOINT_TEST_FAULT", "confirmed:1")
    monkeypatch.setenv("SPARKPOINT_TEST_FAULT_ONCE", str(tmp_path / "fault-fired"))

    run = run_dag(dagbag, "example_sparkpoint_incremental_etl", **paths)

    assert (tmp_path / "fault-fired").exists(), "the first try was not killed"
    assert run.state == "success" and task_instance(run, "windowed_counts").try_number == 2
    result = xcom(run, "windowed_counts")
    assert result["status"] == "finished" and result["generation"] == 2
    assert result["restore_mode"] == "snapshot" and result["first_batch"] == 1, "the retry must resume"
    assert window_rows(tmp_path / "views") == expected_windows(files)
    assert_each_batch_committed_once(tmp_path / "views")
    assert orphaned_staged_files(tmp_path / "views", "etl_windowed_counts") == []


# slow: about 1.5 minutes; availableNow runs that read only new input are in the default run (quickstart DAG,
# e2e)
@pytest.mark.slow
@pytest.mark.spark
def test_incremental_etl_next_run_reads_only_new_input(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_storage(monkeypatch, tmp_path / "checkpoints")
    paths = {"input": str(tmp_path / "input"), "output": str(tmp_path / "views")}
    for index in range(3):
        write_batch_file(tmp_path / "input", index, page_views(index))
    first = xcom(run_dag(dagbag, "example_sparkpoint_incremental_etl", **paths), "windowed_counts")
    assert window_rows(tmp_path / "views") == expected_windows(3)

    for index in range(3, 5):  # the next hour's input; its first window was already open
        write_batch_file(tmp_path / "input", index, page_views(index))
    run = run_dag(dagbag, "example_sparkpoint_incremental_etl", **paths)
    assert run.state == "success"
    second = xcom(run, "windowed_counts")
    assert second["first_batch"] == first["last_batch"] + 1
    assert second["restore_mode"] in ("in-place", "snapshot")
    assert window_rows(tmp_path / "views") == expected_windows(5)
    assert_each_batch_committed_once(tmp_path / "views")


# ---------------------------------------------------------------------------- write-audit-publish


def events(index: int, *, bad: bool = False) -> list[dict[str, Any]]:
    """Three events per file; each file repeats one event of the previous file (and one
    of its own): producers retry. `bad` adds an event with a negative amount."""
    rows = [
        {"event_id": f"e{index * 3 + j}", "ts": iso(index * 3 + j), "user": f"u{j}", "amount": index * 10 + j}
        for j in range(3)
    ]
    if index > 0:
        rows.append(events(index - 1)[2])
    rows.append(rows[0])
    if bad:
        rows.append({"event_id": f"bad{index}", "ts": iso(index * 3), "user": "u9", "amount": -5})
    return rows


def unique_events(files: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for rows in files:
        for row in rows:
            seen.setdefault(row["event_id"], row)
    return sorted(seen.values(), key=lambda r: r["event_id"])


def event_rows(table: Path) -> list[dict[str, Any]]:
    rows = [{**r, "ts": utc(r["ts"])} for r in delta_rows(table)]
    return sorted(rows, key=lambda r: r["event_id"])


@pytest.mark.spark
def test_write_audit_publish_publishes_clean_output_and_discards_rejected_output(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_storage(monkeypatch, tmp_path / "checkpoints")
    paths = {"input": str(tmp_path / "input"), "output": str(tmp_path / "events")}
    table = tmp_path / "events"
    clean = [events(i) for i in range(3)]
    for index, rows in enumerate(clean):
        write_batch_file(tmp_path / "input", index, rows)

    run = run_dag(dagbag, "example_sparkpoint_write_audit_publish", **paths)
    assert run.state == "success", task_states(run)
    assert task_states(run) == {"write": "success", "audit": "success", "publish": "success",
                                "discard": "skipped", "rejected": "skipped"}
    assert xcom(run, "write")["committed_batches"] == []  # staged only: external commit mode
    published = xcom(run, "publish")
    assert published["committed"] and not published["aborted"] and not published["pending"]
    assert event_rows(table) == unique_events(clean)
    first_commits = assert_each_batch_committed_once(table)

    # The next run's input repeats a published event and carries a bad row: rejected.
    rejected_files = [events(3, bad=True), events(4)]
    for index, rows in enumerate(rejected_files, start=3):
        write_batch_file(tmp_path / "input", index, rows)
    run = run_dag(dagbag, "example_sparkpoint_write_audit_publish", **paths)
    assert run.state == "failed"
    assert task_states(run) == {"write": "success", "audit": "success", "publish": "skipped",
                                "discard": "success", "rejected": "failed"}
    discarded = xcom(run, "discard")["aborted"]
    generation = xcom(run, "write")["generation"]
    assert discarded and all(txn.endswith(f"-g{generation}") for txn in discarded)
    assert event_rows(table) == unique_events(clean), "rejected output became visible"
    assert delta_commits(table) == first_commits
    assert catalog(tmp_path / "checkpoints", "wap_events").transactions() == []
    assert orphaned_staged_files(table, "wap_events") == []


# ---------------------------------------------------------------------------- scheduled savepoints


def readings(index: int) -> list[dict[str, Any]]:
    """Four readings per sensor per file, one a minute; every fifth of s1 and every
    seventh of s2 is under the limit (90)."""
    rows = []
    for j in range(4):
        minute = index * 4 + j
        rows.append({"sensor": "s1", "ts": iso(minute), "value": 50.0 if minute % 5 == 4 else 91.0 + minute})
        rows.append({"sensor": "s2", "ts": iso(minute), "value": 20.0 if minute % 7 == 6 else 95.5})
    return rows


def expected_alerts(files: int, limit: float = 90, n: int = 3) -> list[tuple[str, str, str, float]]:
    alerts = []
    buffers: dict[str, list[tuple[str, float]]] = {}
    for index in range(files):
        for row in sorted(readings(index), key=lambda r: r["ts"]):
            buffer = buffers.setdefault(row["sensor"], [])
            if row["value"] <= limit:
                buffer.clear()
                continue
            buffer.append((row["ts"], row["value"]))
            if len(buffer) == n:
                alerts.append((row["sensor"], buffer[0][0], buffer[-1][0], max(v for _, v in buffer)))
                buffer.clear()
    return sorted(alerts)


def alert_rows(table: Path) -> list[tuple[str, str, str, float]]:
    rows = delta_rows(table)
    assert all(r["readings"] == 3 for r in rows)
    return sorted((r["sensor"], utc(r["first_ts"]), utc(r["last_ts"]), r["peak"]) for r in rows)


@pytest.mark.spark
def test_scheduled_savepoints_of_a_running_job(
    dagbag: Any, background: dict[str, Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = background_job(background, request)
    use_storage(monkeypatch, job.root)
    params = {"job_name": job.job}
    generation = job.wait_checkpointed(batch=1)
    savepoints = []
    for index in range(2, 6):  # four scheduled runs, new readings in between
        write_batch_file(job.input, index, readings(index))
        job.wait_checkpointed(batch=index)
        run = run_dag(dagbag, "example_sparkpoint_scheduled_savepoints", **params)
        assert task_states(run) == {"savepoint": "success", "retained_savepoints": "success"}, job.tail()
        savepoints.append(xcom(run, "savepoint"))
        assert xcom(run, "retained_savepoints") == savepoints[::-1][:3]  # newest first, at most 3

    listed = job.catalog.list_savepoints()
    assert [e.uri for e in listed] == savepoints[::-1][:3], "retention must dispose of the oldest"
    batches = [e.metadata.batch_id for e in reversed(listed)]
    assert batches == sorted(batches) and len(set(batches)) == 3, "each savepoint is a later cut"
    assert {e.metadata.generation for e in listed} == {generation}
    assert job.proc is not None and job.proc.poll() is None, "a savepoint must not stop the job"

    # The job kept running through every savepoint: its output is exact.
    ControlChannel(job.catalog).submit("stop", generation=generation, timeout_s=120, requested_by="test")
    assert job.wait_exit() == 0, job.tail()
    assert alert_rows(job.output) == expected_alerts(6)
    assert_each_batch_committed_once(job.output)


# ---------------------------------------------------------------------------- blue-green

# Blue's backlog (read in blue's first micro-batch) and the input that arrives for green.
BLUE_FILES = [("u0", "u1", "u2"), ("u0", "u1", "u2")]
GREEN_FILES = [("u1", "u2", "u3"), ("u1", "u3"), ("u2", "u3")]


def totals_rows(index: int, users: Iterable[str]) -> list[dict[str, Any]]:
    return [{"user": user, "amount": index * 10 + int(user[1:])} for user in users]


def blue_green_totals(green_version: int | None) -> dict[str, tuple[int, int, int]]:
    """(total, events, code_version) by user: blue's backlog only (`green_version` None),
    or all input with green's rows written by code version `green_version`."""
    files = [(users, 1) for users in BLUE_FILES]
    if green_version is not None:
        files += [(users, green_version) for users in GREEN_FILES]
    totals: dict[str, tuple[int, int, int]] = {}
    for index, (users, version) in enumerate(files):
        for row in totals_rows(index, users):
            total, count, _ = totals.get(row["user"], (0, 0, 1))
            totals[row["user"]] = (total + row["amount"], count + 1, version)
    return totals


def totals_table(table: Path) -> dict[str, tuple[int, int, int]]:
    rows = delta_rows(table)
    got = {r["user"]: (r["total"], r["events"], r["code_version"]) for r in rows}
    assert len(got) == len(rows), f"duplicate users: {rows}"
    return got


def start_blue_green(background: dict[str, Any], request: pytest.FixtureRequest,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[SubmittedJob, int]:
    """Blue has processed its backlog (batch 0); then green's input arrives."""
    blue = background_job(background, request)
    use_storage(monkeypatch, blue.root)
    generation = blue.wait_checkpointed(batch=0)
    for index, users in enumerate(GREEN_FILES, start=len(BLUE_FILES)):
        write_batch_file(blue.input, index, totals_rows(index, users))
    blue.wait_for("blue's first commit", lambda: totals_table(blue.output) == blue_green_totals(None))
    return blue, generation


def blue_green_params(blue: SubmittedJob, **extra: Any) -> dict[str, Any]:
    return {"job_name": blue.job, "input": str(blue.input), "output": str(blue.output), **extra}


def assert_rolled_back(blue: SubmittedJob, run: Any, blue_generation: int) -> None:
    """Blue is back from the savepoint; nothing of green ever reached the table."""
    savepoint = xcom(run, "stop_blue")
    green_generation = xcom(run, "start_green", key="generation")
    assert green_generation == blue_generation + 1
    assert xcom(run, "abort_green")["aborted"], "green's staged output must be aborted"
    restored = xcom(run, "restore_blue")
    assert restored["status"] == "finished" and restored["restored_from"] == savepoint
    # the rollback claimed green + 1 to fence green; blue's restore is the next one
    assert restored["generation"] == green_generation + 2 and restored["first_batch"] == 1
    assert totals_table(blue.output) == blue_green_totals(green_version=1)
    commits = assert_each_batch_committed_once(blue.output)
    assert green_generation not in {c["generation"] for c in commits}, f"green committed: {commits}"
    assert [c["batch"] for c in commits] == [0, 1, 2, 3]
    assert orphaned_staged_files(blue.output, blue.job) == []
    assert blue.catalog.transactions() == []


# slow: the example DAG's publish path with its pre-flight runs in the default suite through a real Airflow
# (tests/e2e/test_e2e_blue_green)
@pytest.mark.slow
@pytest.mark.spark
def test_blue_green_publishes_a_healthy_green(
    dagbag: Any, background: dict[str, Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    blue, blue_generation = start_blue_green(background, request, monkeypatch)

    run = run_dag(dagbag, "example_sparkpoint_blue_green", **blue_green_params(blue))

    assert blue.wait_exit() == 0, blue.tail()  # stopped with a savepoint
    assert run.state == "success", task_states(run)
    assert task_states(run) == {
        "deploy_path": "success", **ZERO_DOWNTIME_SKIPPED, "preflight_green": "success",
        "stop_blue": "success", "start_green": "success",
        "green_healthy": "success", "audit_green": "success",
        "decide": "success", "publish_green": "success", "abort_green": "skipped", "restore_blue": "skipped",
        "rolled_back": "skipped",
    }
    # green read blue's newest checkpoint, in scratch, before the stop
    preflight = xcom(run, "preflight_green")
    assert preflight["ok"] and preflight["batch_id"] == 0 and preflight["result"]["batches_processed"] == 3
    assert preflight["result"]["job"] == f"{blue.job}-preflight"
    green = xcom(run, "start_green")
    assert green["generation"] == blue_generation + 1 and green["restored_from"] == xcom(run, "stop_blue")
    assert green["committed_batches"] == [] and green["first_batch"] == 1  # staged only
    assert xcom(run, "green_healthy")["count"] >= 2
    assert xcom(run, "audit_green") == {"approved": True, "problems": [], "rows": 7}
    assert len(xcom(run, "publish_green")["committed"]) == 3
    assert totals_table(blue.output) == blue_green_totals(green_version=2)
    commits = assert_each_batch_committed_once(blue.output)
    assert [(c["batch"], c["generation"]) for c in commits] == [
        (0, blue_generation), (1, green["generation"]), (2, green["generation"]), (3, green["generation"])]
    assert orphaned_staged_files(blue.output, blue.job) == []


def test_blue_green_ends_at_a_refused_preflight_and_never_touches_blue(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG's wiring when the pre-flight fails (here before any Spark: blue has no
    completed checkpoint yet; tests/integration/test_preflight.py refuses a real
    incompatible green): nothing after it acts on blue's job, and the run fails."""
    root = tmp_path / "sp"
    catalog = Catalog(open_storage(str(root)), "bg_refused")
    catalog.claim_generation()  # blue started, not yet checkpointed
    use_storage(monkeypatch, root)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    run = run_dag(dagbag, "example_sparkpoint_blue_green", job_name="bg_refused", input=str(tmp_path / "in"),
                  output=str(tmp_path / "out"))

    assert run.state == "failed"
    states = task_states(run)
    assert states["preflight_green"] == "failed" and states["decide"] == "failed", states
    after_green = ("stop_blue", "start_green", "publish_green", "restore_blue", "rolled_back")
    assert {states[t] for t in after_green} == {"upstream_failed"}, states
    assert states["abort_green"] in ("skipped", "upstream_failed"), states  # never ran
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before, \
        "something wrote to blue's store"
    assert ControlChannel(catalog).request_ids() == [] and catalog.current_generation() == 1


# slow: the rollback path is in the default run (test_blue_green_rolls_back_a_rejected_green)
@pytest.mark.slow
@pytest.mark.spark
def test_blue_green_rolls_back_a_failing_green(
    dagbag: Any, background: dict[str, Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    blue, blue_generation = start_blue_green(background, request, monkeypatch)

    # Green stages batch 1 (confirmed by a checkpoint), then raises in batch 2.
    params = blue_green_params(blue, green_fail_after_batch=1, preflight=False)  # the publish test runs it
    run = run_dag(dagbag, "example_sparkpoint_blue_green", **params)

    assert blue.wait_exit() == 0, blue.tail()
    assert run.state == "failed"  # a rolled-back deploy alerts
    assert task_states(run) == {
        "deploy_path": "success", **ZERO_DOWNTIME_SKIPPED, "preflight_green": "skipped",
        "stop_blue": "success", "start_green": "failed", "green_healthy": "upstream_failed",
        "audit_green": "upstream_failed", "decide": "success", "publish_green": "skipped",
        "abort_green": "success", "restore_blue": "success", "rolled_back": "failed",
    }
    assert xcom(run, "decide", key="reason") == "green failed"
    assert_rolled_back(blue, run, blue_generation)


@pytest.mark.spark
def test_blue_green_rolls_back_a_rejected_green(
    dagbag: Any, background: dict[str, Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    blue, blue_generation = start_blue_green(background, request, monkeypatch)

    run = run_dag(dagbag, "example_sparkpoint_blue_green", **blue_green_params(blue, reject_audit=True,
                                                                               preflight=False))

    assert blue.wait_exit() == 0, blue.tail()
    assert run.state == "failed"
    assert task_states(run) == {
        "deploy_path": "success", **ZERO_DOWNTIME_SKIPPED, "preflight_green": "skipped",
        "stop_blue": "success", "start_green": "success",
        "green_healthy": "success", "audit_green": "success",
        "decide": "success", "publish_green": "skipped", "abort_green": "success", "restore_blue": "success",
        "rolled_back": "failed",
    }
    audit = xcom(run, "audit_green")
    assert audit["approved"] is False and audit["problems"] == ["rejected on request (reject_audit=true)"]
    assert len(xcom(run, "abort_green")["aborted"]) == 3
    assert_rolled_back(blue, run, blue_generation)


# slow: write-audit-publish runs in the default suite on local storage; S3 sinks and connections in their own
# tests
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.s3
def test_write_audit_publish_on_s3_through_a_connection(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server_process: str
) -> None:
    """The same DAG file on S3: storage, staged output and the table behind the
    ``sparkpoint_default`` connection (endpoint and credentials), audited through the hook."""
    import uuid

    import boto3

    from airflow_sparkpoint.hooks import SparkpointHook

    bucket = f"wap-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_server_process, region_name="us-east-1").create_bucket(Bucket=bucket)
    use_storage(monkeypatch, f"s3://{bucket}/sp", login="AKIAWAPTEST", password="wap-secret",
                extra={"endpoint_url": s3_server_process, "region_name": "us-east-1"})
    monkeypatch.setenv("SPARKPOINT_WORK_DIR", str(tmp_path / "work"))  # Spark's live checkpoint: local disk
    output = f"s3://{bucket}/events"
    clean = [events(i) for i in range(2)]
    for index, rows in enumerate(clean):
        write_batch_file(tmp_path / "input", index, rows)

    run = run_dag(dagbag, "example_sparkpoint_write_audit_publish", input=str(tmp_path / "input"),
                  output=output)
    assert task_states(run) == {"write": "success", "audit": "success", "publish": "success",
                                "discard": "skipped", "rejected": "skipped"}
    assert "wap-secret" not in json.dumps(xcom(run, "write"))
    hook = SparkpointHook("sparkpoint_default")
    published = sorted(({**r, "ts": utc(r["ts"])} for r in hook.delta_rows(output)),
                       key=lambda r: r["event_id"])
    assert published == unique_events(clean)

    write_batch_file(tmp_path / "input", 2, events(2, bad=True))
    run = run_dag(dagbag, "example_sparkpoint_write_audit_publish", input=str(tmp_path / "input"),
                  output=output)
    assert task_states(run)["discard"] == "success" and task_states(run)["publish"] == "skipped"
    again = sorted(({**r, "ts": utc(r["ts"])} for r in hook.delta_rows(output)), key=lambda r: r["event_id"])
    assert again == unique_events(clean), "rejected output became visible"
    assert hook.pending_transactions("wap_events") == []
