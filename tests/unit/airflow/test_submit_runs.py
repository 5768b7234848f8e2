"""SparkpointSubmitOperator without Spark (issue #19): it finds its own run by its submit
token (never "the newest generation"), publishes the generation even when the try
fails, reads its task state record on a retry, refuses cluster deploy mode, picks the
Python of Spark's workers, and shows its extra links while the job runs.

spark-submit is replaced at the Spark provider's `subprocess` by a stand-in that does
what a driver does to the catalog (claim a generation with the token it was given,
write a result, complete a checkpoint). `on_kill` signals real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError
from tests.support.fake_submit import JOB, Driver, FakeStore, driver, operator
from tests.support.records import live_submit_run, write_status
from tests.support.task_instances import FakeTI
from tests.support.waits import wait_for

__all__ = ["driver"]  # the fixture

pytestmark = pytest.mark.airflow


def submit_environment(op: Any, master: str, **kwargs: Any) -> dict[str, str]:
    """`submit_client.submit_environment` (imported when called: Airflow is not imported
    when this module is)."""
    from airflow_sparkpoint.operators.submit_client import submit_environment

    return submit_environment(op, master, **kwargs)


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def run(op: Any, ti: FakeTI, store: FakeStore | None = None) -> Any:
    context: Any = {"ti": ti}
    if store is not None:
        context["task_state_store"] = store
    return op.execute(context)


# ---------------------------------------------------------------------------- whose run


def test_the_result_is_the_tries_own_run_even_when_a_newer_generation_exists(
    tmp_path: Path, driver: Driver
) -> None:
    def own_then_another(d: Driver, env: dict[str, str]) -> int:
        mine = d.claim(env)
        d.result(mine, batches_processed=3)
        other = d.catalog.claim_generation({"submitter": "someone-else"}).generation  # e.g. a cleared try
        d.result(other, status="stopped", batches_processed=0)
        return 0

    driver.behaviour = own_then_another
    ti = FakeTI()
    result = run(operator(tmp_path / "sp"), ti)
    assert result["generation"] == 1 and result["batches_processed"] == 3
    assert ti.pushed["generation"] == 1
    assert ti.pushed["spark_application"]["app"] == "app-20260101-0001"


def test_a_garbled_claim_of_another_generation_does_not_hide_the_tries_own_run(
        tmp_path: Path, driver: Driver) -> None:
    from airflow_sparkpoint.checkpoints import layout

    def garbled_then_own(d: Driver, env: dict[str, str]) -> int:
        # generation 1: a claim whose fields are not the types a driver writes (a damaged
        # object, or one planted by whoever can write the store)
        d.catalog.store.put(layout.generation_key(1), json.dumps(
            {"generation": 1, "started_at": 1.0, "host": "h", "pid": "not-a-pid", "details": {}}).encode())
        d.result(d.claim(env), batches_processed=3)
        return 0

    driver.behaviour = garbled_then_own
    ti = FakeTI()
    result = run(operator(tmp_path / "sp"), ti)
    assert result["generation"] == 2 and result["batches_processed"] == 3
    published = ti.pushed["spark_application"]
    assert set(published) == {"generation", "app", "ui", "host", "pid", "started_at"}, published
    assert published["generation"] == 2 and published["ui"] == "http://driver-host:4041"
    assert published["pid"] == os.getpid() and published["started_at"] > 0


def test_a_failed_try_still_publishes_the_generation_it_ran(tmp_path: Path, driver: Driver) -> None:
    from airflow.sdk.exceptions import AirflowException

    def claim_then_die(d: Driver, env: dict[str, str]) -> int:
        d.claim(env)
        d.catalog.claim_generation({"submitter": "a later run"})
        return 1

    driver.behaviour = claim_then_die
    ti = FakeTI()
    with pytest.raises(AirflowException, match="Error code is: 1"):
        run(operator(tmp_path / "sp"), ti)
    assert ti.pushed["generation"] == 1, "the rollback needs the failed run's generation, not the newest"


def test_a_failed_try_says_what_the_job_reported(tmp_path: Path, driver: Driver) -> None:
    """The hook's error is only the command and its exit code; the task's exception is the
    job's own error (from its status record) with the log pointer after it, and only when
    it is this try's run that failed."""
    from airflow.sdk.exceptions import AirflowException

    def fail(d: Driver, env: dict[str, str]) -> int:
        generation = d.claim(env)
        write_status(d.catalog, "failed", generation=generation,
                     error="RuntimeError: keyed_totals v2: simulated failure in batch 2")
        return 1

    driver.behaviour = fail
    with pytest.raises(AirflowException,
                       match=r"^job 'orders' failed: RuntimeError: keyed_totals v2: simulated "
                             r"failure in batch 2\n\(spark-submit exited with code 1; the driver's "
                             r"output is in this task's log"):
        run(operator(tmp_path / "sp"), FakeTI())

    def superseded(d: Driver, env: dict[str, str]) -> int:
        d.claim(env)
        later = d.catalog.claim_generation({"submitter": "a later run"}).generation
        write_status(d.catalog, "failed", generation=later, error="not this try's error")
        return 1

    driver.behaviour = superseded
    with pytest.raises(AirflowException) as info:
        run(operator(tmp_path / "sp"), FakeTI())
    assert "not this try's error" not in str(info.value)


def test_links_are_published_while_the_job_runs(tmp_path: Path, driver: Driver,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.operators.links import SparkpointCheckpointHistoryLink, SparkpointSparkUILink

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/prefix/")
    monkeypatch.setenv("AIRFLOW_CONN_SP_LINKS",
                       json.dumps({"conn_type": "sparkpoint", "host": str(tmp_path / "sp")}))
    ti = FakeTI()
    seen_while_running: dict[str, Any] = {}

    def long_running(d: Driver, env: dict[str, str]) -> int:
        generation = d.claim(env)
        deadline = time.monotonic() + 60
        while "generation" not in ti.pushed and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_while_running.update(ti.pushed)
        d.result(generation)
        return 0

    driver.behaviour = long_running
    op = operator(tmp_path / "sp", checkpoint_dir=None, sparkpoint_conn_id="sp_links")
    run(op, ti)
    ui, history = SparkpointSparkUILink(), SparkpointCheckpointHistoryLink()
    assert seen_while_running[ui.xcom_key] == "http://driver-host:4041"
    assert seen_while_running[history.xcom_key] == (
        "https://airflow.example.com/prefix/sparkpoint/pipelines/sp_links/orders")
    assert ui.get_link(op, ti_key=None) == "http://driver-host:4041"  # type: ignore[arg-type]
    op.spark_history_server = "http://history:18080/"
    assert ui.get_link(op, ti_key=None) == "http://history:18080/history/app-20260101-0001/"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("root", "options", "expected"),
    [
        ("s3://bucket/sp", {}, "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=sp/orders/"),
        ("s3://bucket/sp", {"endpoint_url": "http://minio:9000"}, "http://minio:9000/bucket/sp/orders/"),
        ("/data/sp", {}, "file:///data/sp/orders"),
    ],
)
def test_checkpoint_history_link_without_a_connection_is_the_storage_location(
    root: str, options: dict[str, Any], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sparkpoint.hooks import SparkpointHook
    from airflow_sparkpoint.operators.links import checkpoint_history_url

    if options:
        monkeypatch.setattr(SparkpointHook, "_resolve", lambda self: (root, dict(options), {}))
    assert checkpoint_history_url(JOB, None, root).rstrip("/") == expected.rstrip("/")
    assert checkpoint_history_url("{{ params.job }}", None, root) == ""  # unrendered: no link


# ---------------------------------------------------------------------------- retries read the task record


def test_a_retry_restores_the_savepoint_again_until_a_try_of_the_task_checkpointed(
    tmp_path: Path, driver: Driver
) -> None:
    root = tmp_path / "sp"
    blue = driver.catalog.claim_generation().generation
    savepoint = driver.catalog.create_savepoint(driver.catalog.handle(driver.checkpoint(blue))).uri
    store = FakeStore()

    def dies_before_its_first_checkpoint(d: Driver, env: dict[str, str]) -> int:
        d.claim(env)
        blue_again = d.catalog.claim_generation().generation  # another run of the job checkpoints meanwhile
        time.sleep(0.01)
        d.checkpoint(blue_again)
        return 137

    driver.behaviour = dies_before_its_first_checkpoint
    with pytest.raises(Exception, match="Error code is: 137"):
        run(operator(root, restore=savepoint), FakeTI(1), store)
    assert driver.conf()["spark.sparkpoint.restore"] == savepoint

    def checkpoints_then_dies(d: Driver, env: dict[str, str]) -> int:
        d.checkpoint(d.claim(env))
        return 137

    driver.behaviour = checkpoints_then_dies
    with pytest.raises(Exception, match="Error code is: 137"):
        run(operator(root, restore=savepoint), FakeTI(2), store)
    # The newest checkpoint is another run's (newer than the savepoint), not this task's.
    assert driver.conf()["spark.sparkpoint.restore"] == savepoint

    driver.behaviour = Driver.finish
    run(operator(root, restore=savepoint), FakeTI(3), store)
    assert driver.conf()["spark.sparkpoint.restore"] == "latest", "try 2 checkpointed: resume from it"
    record = store.values["sparkpoint_submit"]
    assert record["try_number"] == 3 and record["since"] == blue and record["restore"] == "latest"
    assert len(record["tokens"]) == 3


# ---------------------------------------------------------------------------- deploy modes and Python


@pytest.mark.parametrize("where", ["operator", "connection", "conf"])
def test_cluster_deploy_mode_is_refused_before_anything_runs(
    tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Cluster mode on a local master, or on YARN with a store of this worker's disk, from
    wherever it is asked for (the accepted combinations: test_submit_cluster.py)."""
    kwargs: dict[str, Any] = {}
    expected = r"deploy_mode='cluster' \(from .*\) on the local master 'local\[2\]' is refused"
    if where == "operator":
        kwargs["deploy_mode"] = "cluster"
    elif where == "connection":
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
            {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
        expected = f"on yarn is refused with the store '{tmp_path / 'sp'}'"
    else:
        kwargs["conf"] = {"spark.submit.deployMode": "cluster"}
    store = FakeStore()
    with pytest.raises(ConfigError, match=expected):
        run(operator(tmp_path / "sp", **kwargs), FakeTI(), store)
    assert driver.commands == [] and driver.catalog.current_generation() == 0 and store.values == {}


@pytest.mark.parametrize("work_dir", ["hdfs://nn:8020/live", "s3a://sparkpoint/live", "gs://b/live"])
def test_a_work_dir_the_runtime_cannot_capture_is_refused_before_spark_submit(
    tmp_path: Path, driver: Driver, work_dir: str
) -> None:
    store = FakeStore()
    with pytest.raises(ConfigError, match=f"workDir='{work_dir}': the runtime cannot capture"):
        run(operator(tmp_path / "sp", work_dir=work_dir), FakeTI(), store)
    assert driver.commands == [] and driver.catalog.current_generation() == 0


def test_python_of_sparks_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    root = tmp_path / "sp"
    local = submit_environment(operator(root), "local[2]")
    assert local["PYSPARK_PYTHON"] == sys.executable and local["PYSPARK_DRIVER_PYTHON"] == sys.executable
    cluster = submit_environment(operator(root), "spark://10.0.0.1:7077")
    assert cluster["PYSPARK_PYTHON"] == "python3", "this worker's venv path means nothing on a cluster"
    assert cluster["PYSPARK_DRIVER_PYTHON"] == sys.executable  # client mode: the driver runs here
    monkeypatch.setenv("AIRFLOW_CONN_SP_PY", json.dumps(
        {"conn_type": "sparkpoint", "host": str(root), "extra": {"pyspark_python": "/opt/conda/bin/python"}}))
    from_conn = submit_environment(operator(root, checkpoint_dir=None, sparkpoint_conn_id="sp_py"), "yarn")
    assert from_conn["PYSPARK_PYTHON"] == "/opt/conda/bin/python"
    python_conf = {"spark.pyspark.python": "/x/python"}
    assert "PYSPARK_PYTHON" not in submit_environment(operator(root, conf=python_conf), "yarn")
    python_env = {"PYSPARK_PYTHON": "/y"}
    assert "PYSPARK_PYTHON" not in submit_environment(operator(root, env_vars=python_env), "yarn")


def test_the_drivers_rocksdb_library_goes_to_the_submission_directory_unless_one_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROCKSDB_SHAREDLIB_DIR", raising=False)
    root = tmp_path / "sp"
    native = submit_environment(operator(root), "local[2]", native_dir="/t/d/native")
    assert native["ROCKSDB_SHAREDLIB_DIR"] == "/t/d/native"
    assert "ROCKSDB_SHAREDLIB_DIR" not in submit_environment(operator(root), "local[2]")
    mine = operator(root, env_vars={"ROCKSDB_SHAREDLIB_DIR": "/mine"})
    given = submit_environment(mine, "local[2]", native_dir="/x")
    assert "ROCKSDB_SHAREDLIB_DIR" not in given  # the task's env_vars keep theirs
    monkeypatch.setenv("ROCKSDB_SHAREDLIB_DIR", "/workers")
    assert "ROCKSDB_SHAREDLIB_DIR" not in submit_environment(operator(root), "local[2]", native_dir="/x")


@pytest.mark.parametrize("exit_code", [0, 1])
def test_each_submit_has_its_own_directory_for_the_drivers_native_library_removed_when_spark_submit_ends(
    tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch, exit_code: int
) -> None:
    import tempfile

    from airflow.sdk.exceptions import AirflowException

    monkeypatch.delenv("ROCKSDB_SHAREDLIB_DIR", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    seen: list[tuple[str, bool]] = []

    def driver_run(d: Driver, env: dict[str, str]) -> int:
        native = env["ROCKSDB_SHAREDLIB_DIR"]
        seen.append((native, os.path.isdir(native)))
        Path(native, "librocksdbjni-linux64.so").write_bytes(b"x")  # what RocksJava extracts there
        Driver.finish(d, env)
        return exit_code

    driver.behaviour = driver_run
    if exit_code:
        with pytest.raises(AirflowException):
            run(operator(tmp_path / "sp", ship_runtime=True), FakeTI())
    else:
        run(operator(tmp_path / "sp", ship_runtime=True), FakeTI())
    op = operator(tmp_path / "sp2", ship_runtime=True)
    for _ in range(2):  # the same operator object again (a retry that reuses it): a directory of its own
        try:
            run(op, FakeTI())
        except AirflowException:
            pass
    assert len(seen) == 3 and len({native for native, _e in seen}) == 3, seen
    assert all(existed for _n, existed in seen), seen
    native, existed = seen[0]
    assert existed and Path(native).parent.parent == tmp_path / "tmp"
    assert list((tmp_path / "tmp").iterdir()) == [], \
        "the submission directory is removed when spark-submit ended"
    shipped = [a for a in driver.commands[0] if a.endswith(".zip")]
    assert shipped and Path(native).parent.as_posix() in shipped[0], "the runtime archive is in it too"


@pytest.mark.parametrize("pyspark_here", ["none", "pyspark-client"])
def test_a_worker_without_a_spark_distribution_leaves_spark_home_and_the_drivers_python_to_the_spark_environment(  # noqa: E501
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pyspark_here: str
) -> None:
    """An Airflow worker as docs/install.md installs it: no pyspark, or only the Spark
    provider's pyspark-client (a ``pyspark`` package with no ``bin/spark-submit``, no jars).
    Its interpreter cannot run a driver and its pyspark is no SPARK_HOME: the driver runs
    the Spark environment's Python (the connection's, through PYSPARK_PYTHON)."""
    if pyspark_here == "none":
        monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    else:
        client = tmp_path / "site" / "pyspark"
        client.mkdir(parents=True)
        (client / "__init__.py").write_text("")
        monkeypatch.setitem(sys.modules, "pyspark",
                            types.SimpleNamespace(__file__=str(client / "__init__.py")))
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "sp"
    monkeypatch.setenv("AIRFLOW_CONN_SP_PY", json.dumps(
        {"conn_type": "sparkpoint", "host": str(root), "extra": {"pyspark_python": "/spark-env/bin/python"}}))
    by_conn = operator(root, checkpoint_dir=None, sparkpoint_conn_id="sp_py")
    from_conn = submit_environment(by_conn, "local[2]")
    assert "SPARK_HOME" not in from_conn, \
        f"SPARK_HOME set to a pyspark that is no Spark distribution: {from_conn}"
    assert "PYSPARK_DRIVER_PYTHON" not in from_conn, \
        f"the driver would run this worker's interpreter, which has no pyspark to run it: {from_conn}"
    assert from_conn["PYSPARK_PYTHON"] == "/spark-env/bin/python"  # Spark runs the driver with it too
    local = submit_environment(operator(root), "local[2]")
    assert "PYSPARK_DRIVER_PYTHON" not in local and local["PYSPARK_PYTHON"] == "python3", local
    given = submit_environment(operator(root, env_vars={"PYSPARK_DRIVER_PYTHON": "/d"}), "local[2]")
    assert "PYSPARK_DRIVER_PYTHON" not in given and given["PYSPARK_PYTHON"] == "python3", given


# ---------------------------------------------------------------------------- on_kill


_CHILD = """
import os, signal, subprocess, sys, time
def term(signum, frame):
    open(os.path.join(sys.argv[1], f"{os.getpid()}.term"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
if sys.argv[2] == "parent":
    subprocess.Popen([sys.executable, "-c", open(sys.argv[3]).read(), sys.argv[1], "child", sys.argv[3]])
open(os.path.join(sys.argv[1], sys.argv[2] + ".ready"), "w").close()
time.sleep(300)
"""


@pytest.fixture()
def process_tree(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A stand-in spark-submit (parent) with a driver (child); both note SIGTERM and exit."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(marks), "parent", str(script)])
    wait_for("the process tree to start",
             lambda: (marks / "parent.ready").exists() and (marks / "child.ready").exists(), 60,
             interval=0.05)
    yield proc, marks
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_on_kill_files_no_control_request_and_signals_the_driver(
    tmp_path: Path, process_tree: tuple[subprocess.Popen[bytes], Path]
) -> None:
    """Issue #19: on_kill used to file a stop request for any generation, which the dying
    driver never served and the next run obeyed (0 batches, success)."""
    proc, marks = process_tree
    op = operator(tmp_path / "sp", stop_timeout=30)
    op._hook = SimpleNamespace(_submit_sp=proc)
    killed: list[bool] = []
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    original = SparkSubmitOperator.on_kill
    SparkSubmitOperator.on_kill = lambda self: killed.append(True)  # type: ignore[method-assign]
    try:
        op.on_kill()
    finally:
        SparkSubmitOperator.on_kill = original  # type: ignore[method-assign]
    assert proc.poll() == 143, "spark-submit ended on SIGTERM within stop_timeout"
    assert len(list(marks.glob("*.term"))) == 2, "spark-submit and the driver under it both got SIGTERM"
    assert not (tmp_path / "sp" / JOB / "control").exists(), "on_kill must not file a control request"
    assert killed == [True], "the Spark hook's kill still runs (cluster-side cleanup, post-submit commands)"


def test_on_kill_kills_a_driver_that_ignores_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c",
                             ("import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(300)")])
    try:
        time.sleep(0.5)
        op = operator(tmp_path / "sp", stop_timeout=0.5)
        hook = SimpleNamespace(_submit_sp=proc, on_kill=lambda: proc.kill(),
                               _run_post_submit_commands=lambda: None)
        op._hook = hook
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        original = SparkSubmitOperator.on_kill
        SparkSubmitOperator.on_kill = lambda self: self._hook.on_kill()  # type: ignore[method-assign]
        try:
            op.on_kill()
        finally:
            SparkSubmitOperator.on_kill = original  # type: ignore[method-assign]
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------- a start of a running job


def _live_run(catalog: Catalog, dag_id: str, run_id: str) -> int:
    """A live run of the job started by task ``submit`` of `dag_id` by no submit token."""
    return live_submit_run(catalog, dag_id, token=None, run_id=run_id)


def test_a_start_of_a_job_another_task_runs_is_refused_before_spark_submit(
    tmp_path: Path, driver: Driver
) -> None:
    from airflow_sparkpoint.exceptions import JobAlreadyRunning

    running = _live_run(driver.catalog, "production", "scheduled__1")
    store = FakeStore()
    with pytest.raises(JobAlreadyRunning, match=r"generation 1 .*production\.submit try 1.*worker-9"):
        run(operator(tmp_path / "sp"), FakeTI(), store)
    assert driver.commands == [] and store.values == {}  # nothing submitted, nothing recorded
    assert driver.catalog.current_generation() == running


def test_takeover_true_submits_and_tells_the_driver(tmp_path: Path, driver: Driver) -> None:
    _live_run(driver.catalog, "production", "scheduled__1")
    run(operator(tmp_path / "sp", takeover=True), FakeTI())
    assert driver.conf()["spark.sparkpoint.takeover"] == "true"


def test_a_retry_of_the_same_task_takes_over_and_the_driver_knows_its_task(
    tmp_path: Path, driver: Driver
) -> None:
    op = operator(tmp_path / "sp")
    _live_run(driver.catalog, op.dag_id, "manual__7")
    ti = FakeTI(try_number=2)
    op.execute({"ti": ti, "run_id": "manual__7"})
    env = driver.envs[-1]
    assert (env["AIRFLOW_CTX_DAG_ID"], env["AIRFLOW_CTX_TASK_ID"], env["AIRFLOW_CTX_DAG_RUN_ID"],
            env["AIRFLOW_CTX_TRY_NUMBER"]) == (op.dag_id, "submit", "manual__7", "2")
    assert "spark.sparkpoint.takeover" not in driver.conf()


# --------------------------------------------------------------- the driver's error is the task's (issue #48)

_SINK_AHEAD = ("Traceback (most recent call last):\n"
               '  File "/jobs/orders.py", line 9, in <module>\n'
               "    job.run(totals, sink=sink)\n"
               "airflow_sparkpoint.exceptions.SinkAheadError: sink delta:/out committed batch 7, past the "
               "restore target's batch 3\n")


def test_the_drivers_error_line_is_the_tasks_error_with_the_log_pointer_after_it(
        tmp_path: Path, driver: Driver) -> None:
    from airflow_sparkpoint.checkpoints.run_result import error_line
    from airflow_sparkpoint.exceptions import SinkAheadError
    from airflow_sparkpoint.operators.driver_errors import SparkpointRunFailed

    # Refused before the driver claimed a generation: no status record, only its output.
    error = SinkAheadError("sink delta:/out committed batch 7, past the restore target's batch 3")
    driver.output = (f"INFO SparkContext: Running Spark\n{_SINK_AHEAD}{error_line(error)}\nINFO "
                     "ShutdownHookManager\n")
    driver.behaviour = lambda d, env: 1
    with pytest.raises(SparkpointRunFailed) as info:
        run(operator(tmp_path / "sp"), FakeTI())
    message = str(info.value)
    assert message.startswith("job 'orders' failed: SinkAheadError: sink delta:/out committed batch 7, past "
                              "the restore target's batch 3\n"), message
    assert (message.splitlines()[1]
            == ("(spark-submit exited with code 1; the driver's output is in this task's "
                "log above)")), message
    assert info.value.error is not None and info.value.error.type == "SinkAheadError"
    assert "Cannot execute" in str(info.value.__cause__), "the Spark hook's exception is the cause"


def test_a_scripts_own_python_error_is_the_tasks_error(tmp_path: Path, driver: Driver) -> None:
    from airflow_sparkpoint.operators.driver_errors import SparkpointRunFailed

    driver.output = ("INFO starting\nTraceback (most recent call last):\n  File \"/jobs/x.py\", line 3, in "
                     "<module>\n    main()\nValueError: no input under /data/in\nINFO "
                     "ShutdownHookManager: deleting\n")
    driver.behaviour = lambda d, env: 1
    with pytest.raises(SparkpointRunFailed,
                       match=r"^job 'orders' failed: ValueError: no input under /data/in\n"):
        run(operator(tmp_path / "sp"), FakeTI())


def test_a_configuration_error_of_the_driver_is_not_retried_and_its_message_carries_no_secret(
        tmp_path: Path, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_sparkpoint.checkpoints.run_result import error_line

    monkeypatch.setenv("AIRFLOW_CONN_SP_ERR",
                       json.dumps({"conn_type": "sparkpoint", "host": str(tmp_path / "sp"),
                                   "login": "AKIAEXAMPLE", "password": "pw-9f3c2b7e"}))
    leaked = ConfigError("the Sparkpoint runtime is missing deltalake>=1.2,<2 (key "
                         "AKIAEXAMPLE, secret pw-9f3c2b7e)")
    driver.output = f"{error_line(leaked)}\n"
    driver.behaviour = lambda d, env: 1
    with pytest.raises(ConfigError) as info:
        run(operator(tmp_path / "sp", checkpoint_dir=None, sparkpoint_conn_id="sp_err"), FakeTI())
    assert isinstance(info.value, AirflowFailException)
    message = str(info.value)
    assert message.startswith(
        "job 'orders' failed: ConfigError: the Sparkpoint runtime is missing deltalake"), message
    assert "pw-9f3c2b7e" not in message and "AKIAEXAMPLE" not in message, message


def test_a_failed_spark_submit_that_says_nothing_keeps_the_spark_providers_exception(
        tmp_path: Path, driver: Driver) -> None:
    from airflow.sdk.exceptions import AirflowException

    driver.output = "Error: JAVA_HOME is not set\n"
    driver.behaviour = lambda d, env: 1
    with pytest.raises(AirflowException, match="Cannot execute.*Error code is: 1"):
        run(operator(tmp_path / "sp"), FakeTI())
