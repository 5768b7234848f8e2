"""Cluster deploy mode on Kubernetes and YARN with the catalog as the tracker (issue #50).

No cluster runs here, so only the cluster manager's API edge is stood in for
(`tests.support.cluster_managers`): YARN's ResourceManager is a real HTTP server on
127.0.0.1 speaking the REST endpoints used; Kubernetes is the client's pod calls;
spark-submit is a stand-in on PATH that records its command line and prints what a
cluster-mode spark-submit prints. Everything else is real: the operator, the catalog on a
real S3 endpoint (moto's server), the control requests, `SparkpointRunTrigger` in an
asyncio loop. The driver's side (claim with the token it was given, heartbeat, answer a
cancel or not) is `ClusterDriver`, writing the catalog as the runtime does.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.cluster_manager import check_deploy_mode
from airflow_sparkpoint.services.runs import launch_of
from airflow_sparkpoint.storage import open_storage
from tests.support.cluster_managers import (
    K8S_SUBMIT_OUTPUT,
    NAMESPACE,
    POD,
    YARN_APP,
    YARN_SUBMIT_OUTPUT,
    ApiException,
    ClusterDriver,
    Pods,
    conf_of,
    env_with,
    fake_spark_submit,
    resource_manager,
    submitted,
    wait_until,
)
from tests.support.fake_submit import FakeStore
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow

JOB = "orders"
RUN_ID = "manual__1"
K8S_MASTER = "k8s://https://kube.example.com:6443"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.fixture()
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: str,
            s3_bucket: str) -> SimpleNamespace:
    """The fake spark-submit first on PATH, a store on S3 (a ``sparkpoint`` connection
    ``sp_s3``), the Kubernetes client's pods (`Pods`) as the Spark provider's ``kube_client``,
    and a Spark connection ``spark_k8s`` (cluster mode, namespace `NAMESPACE`)."""
    from airflow.providers.apache.spark.hooks import spark_submit

    calls = tmp_path / "submits.jsonl"
    fake_spark_submit(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", env_with(tmp_path / "bin"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "nospark"))  # the worker's own Spark stays off PATH
    root = f"s3://{s3_bucket}/sp"
    connection(monkeypatch, "sp_s3", conn_type="sparkpoint", host=root, extra={"endpoint_url": s3_server})
    connection(monkeypatch, "spark_k8s", conn_type="spark", host=K8S_MASTER,
               extra={"deploy-mode": "cluster", "namespace": NAMESPACE})
    pods = Pods()
    monkeypatch.setattr(spark_submit, "kube_client", pods.client(), raising=False)

    def output(text: str) -> None:
        path = tmp_path / f"output-{len(list(tmp_path.glob('output-*')))}.txt"
        path.write_text(text)
        monkeypatch.setenv("FAKE_SUBMIT_OUTPUT", str(path))

    output(K8S_SUBMIT_OUTPUT)
    catalog = Catalog(open_storage(root, endpoint_url=s3_server), JOB)
    return SimpleNamespace(calls=calls, catalog=catalog, pods=pods, root=root, endpoint=s3_server,
                           output=output)


@pytest.fixture()
def rm(monkeypatch: pytest.MonkeyPatch, cluster: SimpleNamespace) -> Any:
    """A YARN ResourceManager (a real HTTP server) and a Spark connection ``spark_yarn``
    (cluster mode) pointing at it; spark-submit prints what it prints for YARN."""
    with resource_manager() as server:
        connection(monkeypatch, "spark_yarn", conn_type="spark", host="yarn",
                   extra={"deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": server.url})
        cluster.output(YARN_SUBMIT_OUTPUT)
        yield server


@pytest.fixture(autouse=True)
def no_process_kill(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """A cluster driver is never killed by a process group (the client-mode kill): any
    ``killpg`` fails the test."""
    from airflow_sparkpoint.services import detached

    calls: list[tuple[int, int]] = []

    def refuse(pgid: int, sig: int) -> None:
        calls.append((pgid, sig))
        raise AssertionError(f"killpg({pgid}, {sig}) of a cluster-mode run")

    monkeypatch.setattr(detached.os, "killpg", refuse)
    return calls


@pytest.fixture(autouse=True)
def never_the_providers_resumable_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark provider's own cluster-mode path (durable reconnect) is never entered."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the Spark provider's SparkSubmitOperator.execute/execute_resumable ran")

    monkeypatch.setattr(SparkSubmitOperator, "execute", refuse)
    monkeypatch.setattr(SparkSubmitOperator, "execute_resumable", refuse)


def operator(conn_id: str = "spark_k8s", **kwargs: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    kwargs.setdefault("sparkpoint_conn_id", "sp_s3")
    kwargs.setdefault("work_dir", "/mnt/live")  # a ReadWriteMany volume in the driver and executor pods
    return SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB,
                                    conn_id=conn_id, poll_interval=kwargs.pop("poll_interval", 0.2),
                                    dead_after=kwargs.pop("dead_after", 3.0), **kwargs)


def context(ti: FakeTI, store: FakeStore | None) -> Any:
    return {"ti": ti, "run_id": RUN_ID, **({"task_state_store": store} if store is not None else {})}


def cancels(catalog: Catalog) -> list[tuple[str, int | None, float]]:
    channel = ControlChannel(catalog)
    return [(r.kind, r.generation, r.created_at)
            for r in (channel.read_request(i) for i in channel.request_ids())]


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def follows(op: Any, generation: int) -> bool:
    """Whether the task follows run `generation` itself (what its ``on_kill`` would stop)."""
    run = op._try_state.cluster_run
    return run is not None and run.generation == generation


# ---------------------------------------------------------------------------- which combinations run


@pytest.mark.parametrize(("master", "mode", "store", "expected"), [
    (K8S_MASTER, "cluster", "s3://b/sp", "kubernetes"),
    ("yarn", "cluster", "s3://b/sp", "yarn"),
    (K8S_MASTER, "client", "/data/sp", None),
    ("yarn", "client", "file:///data/sp", None),
    ("spark://master:7077", "client", "/data/sp", None),
    ("local[2]", "client", "/data/sp", None),
    ("spark://master:7077", "cluster", "s3://b/sp",
     ("standalone master 'spark://master:7077' is refused: Spark standalone's cluster mode does not "
      "run Python")),
    ("local[2]", "cluster", "s3://b/sp", "local master 'local[2]' is refused: a local master has no cluster"),
    ("mesos://m:5050", "cluster", "s3://b/sp", "master 'mesos://m:5050' is refused; expected a k8s://"),
    (K8S_MASTER, "cluster", "/data/sp", "on kubernetes is refused with the store '/data/sp'"),
    ("yarn", "cluster", "file:///data/sp", "on yarn is refused with the store 'file:///data/sp'"),
    ("yarn", "cluster", "memory://x", "on yarn is refused with the store 'memory://x'"),
])
def test_each_master_and_deploy_mode_is_accepted_or_refused_naming_the_value(
        master: str, mode: str, store: str, expected: str | None) -> None:
    if expected in (None, "kubernetes", "yarn"):
        assert check_deploy_mode(task_id="t", master=master, mode=mode, storage_uri=store) == expected
        return
    with pytest.raises(ConfigError, match="deploy_mode='cluster'") as refused:
        check_deploy_mode(task_id="t", master=master, mode=mode, storage_uri=store)
    assert expected in str(refused.value), str(refused.value)


@pytest.mark.parametrize("case", ["standalone", "local store", "no resource manager", "no kubernetes client"])
def test_a_refused_cluster_mode_fails_before_anything_is_submitted_or_recorded(
        cluster: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str) -> None:
    from airflow.providers.apache.spark.hooks import spark_submit

    from airflow_sparkpoint.operators.submit_checks import SparkpointConfigFailure

    kwargs: dict[str, Any] = {}
    conn_id = "spark_k8s"
    if case == "standalone":
        connection(monkeypatch, "spark_sa", conn_type="spark", host="spark://127.0.0.1", port=7077,
                   extra={"deploy-mode": "cluster"})
        conn_id, expected = "spark_sa", "Spark standalone's cluster mode does not run Python applications"
    elif case == "local store":
        kwargs = {"checkpoint_dir": str(tmp_path / "sp"), "sparkpoint_conn_id": None}
        expected = f"refused with the store '{tmp_path / 'sp'}'"
    elif case == "no resource manager":
        connection(monkeypatch, "spark_yarn_bare", conn_type="spark", host="yarn",
                   extra={"deploy-mode": "cluster"})
        conn_id, expected = "spark_yarn_bare", "has no extra 'yarn_resourcemanager_webapp_address'"
    else:
        monkeypatch.delattr(spark_submit, "kube_client")
        expected = "pip install apache-airflow-providers-cncf-kubernetes"
    store = FakeStore()
    with pytest.raises(SparkpointConfigFailure) as refused:
        operator(conn_id, **kwargs).execute(context(FakeTI(), store))
    assert expected in str(refused.value), str(refused.value)
    assert submitted(cluster.calls) == [] and store.values == {}
    assert cluster.catalog.current_generation() == 0


# ---------------------------------------------------------------------------- the submit and its id


@pytest.mark.parametrize(("kind", "text", "expected"), [
    ("kubernetes", K8S_SUBMIT_OUTPUT, f"{NAMESPACE}:{POD}"),
    ("kubernetes", "\n".join(line for line in K8S_SUBMIT_OUTPUT.splitlines() if "submission ID" not in line),
     f"{NAMESPACE}:{POD}"),
    ("kubernetes", (f"26/11/29 INFO LoggingPodStatusWatcherImpl: Deployed Spark application orders with "
                    f"application ID spark-0a1b and submission ID default:{POD} into Kubernetes"),
     f"default:{POD}"),
    ("yarn", YARN_SUBMIT_OUTPUT, YARN_APP),
    ("kubernetes", YARN_SUBMIT_OUTPUT, None),
    ("yarn", "26/11/29 ERROR Client: Application submission failed: application queue full\n", None),
])
def test_the_driver_is_read_from_spark_submits_output(kind: str, text: str, expected: str | None) -> None:
    from airflow_sparkpoint.services.cluster_manager import parse_submit_output

    driver = parse_submit_output(kind, text.splitlines(), namespace="from-connection")
    assert (driver.id if driver else None) == expected


def test_blocking_kubernetes_run_submits_once_records_the_pod_and_ends_with_the_result(
        cluster: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_sparkpoint.cli.main import main

    ti, store = FakeTI(), FakeStore()
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="finish", pods=cluster.pods) as driver:
        result = operator().execute(context(ti, store))
    assert driver.error is None
    assert result is not None and result["status"] == "finished" and result["generation"] == 1, result
    assert ti.pushed["generation"] == 1 and ti.pushed["spark_application"]["generation"] == 1

    [argv] = submitted(cluster.calls)
    conf = conf_of(argv)
    token = store.values["sparkpoint_detached"]["token"]
    assert (argv[argv.index("--master") + 1] == K8S_MASTER
            and argv[argv.index("--deploy-mode") + 1] == "cluster")
    assert conf["spark.kubernetes.submission.waitAppCompletion"] == "false"
    assert conf["spark.kubernetes.namespace"] == NAMESPACE and conf["spark.sparkpoint.dir"] == cluster.root
    assert conf["spark.kubernetes.driverEnv.SPARKPOINT_SUBMITTER"] == token
    assert conf["spark.kubernetes.driverEnv.AIRFLOW_CTX_TASK_ID"] == "submit"
    assert conf["spark.kubernetes.driverEnv.AIRFLOW_CTX_DAG_RUN_ID"] == RUN_ID
    worker_paths = [k for k in conf
                    if k.endswith(("PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON", "ROCKSDB_SHAREDLIB_DIR",
                                   ".PATH", ".SPARK_HOME"))]
    assert worker_paths == [], f"this worker's paths were given to the driver on the cluster: {worker_paths}"
    assert not any("AWS_SECRET" in a or "aws_secret" in a for a in argv)

    record = store.values["sparkpoint_detached"]
    assert record["generation"] == 1 and record["process"] is None
    assert record["cluster"] == {"driver": {"kind": "kubernetes", "namespace": NAMESPACE, "pod": POD},
                                 "conn_id": "spark_k8s"}
    launch = launch_of(cluster.catalog, 1)
    assert launch is not None and launch.deploy_mode == "cluster" and launch.token == token
    assert dict(launch.driver) == {"kind": "kubernetes", "namespace": NAMESPACE, "pod": POD}
    assert cluster.pods.of("delete") == [], "a finished driver's pod was deleted"

    # on-call: `sparkpoint status` shows where the driver runs
    capsys.readouterr()
    args = ["status", "--dir", cluster.root, "--job", JOB, "--s3-endpoint", cluster.endpoint]
    assert main([*args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["driver"]["where"] == f"Kubernetes pod {NAMESPACE}:{POD}", document
    assert document["driver"]["pod"] == POD and document["driver"]["deploy_mode"] == "cluster"
    assert main(args) == 0
    assert f"Kubernetes pod {NAMESPACE}:{POD} (cluster mode" in capsys.readouterr().out


def test_on_kill_of_a_blocking_run_sends_a_cancel_first_then_deletes_the_pod_after_the_bound(
        cluster: SimpleNamespace) -> None:
    from airflow.sdk.exceptions import AirflowException

    op = operator(stop_timeout=1.5)
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="ignore", pods=cluster.pods) as driver:
        thread, outcome = in_thread(lambda: op.execute(context(FakeTI(), FakeStore())))
        wait_until(lambda: follows(op, 1), what="the claim")
        t0 = time.monotonic()
        op.on_kill()
        took = time.monotonic() - t0
        thread.join(30)
    assert driver.error is None and not thread.is_alive()
    [(kind, generation, cancelled_at)] = cancels(cluster.catalog)
    deletes = cluster.pods.of("delete")
    assert (kind, generation) == ("cancel", 1) and [d[1:3] for d in deletes] == [(POD, NAMESPACE)]
    assert deletes[0][3] - cancelled_at >= 1.5 - 0.05, "the pod was deleted before the stop bound"
    assert took < 5, f"on_kill took {took:.1f} s: Airflow's supervisor SIGKILLs the task 5 s after SIGTERM"
    error = outcome.get("error")
    assert isinstance(error, AirflowException), outcome
    assert f"Kubernetes pod {NAMESPACE}:{POD}" in str(error) and "without recording an end" in str(error)
    print(f"on_kill: cancel, then pod deleted {deletes[0][3] - cancelled_at:.1f} s later; "
          f"on_kill took {took:.1f} s")


def test_on_kill_of_a_blocking_yarn_run_that_answers_the_cancel_kills_nothing(
        cluster: SimpleNamespace, rm: Any) -> None:
    # generous: on_kill returns as soon as the end is recorded; a short bound kills a loaded driver mid-answer
    op = operator("spark_yarn", stop_timeout=60.0)
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="answer", rm=rm) as driver:
        thread, outcome = in_thread(lambda: op.execute(context(FakeTI(), FakeStore())))
        wait_until(lambda: follows(op, 1), what="the claim")
        op.on_kill()
        thread.join(30)
    assert driver.error is None
    assert [c[:2] for c in cancels(cluster.catalog)] == [("cancel", 1)]
    assert rm.kills() == [], "a driver that ended on the cancel was killed too"
    assert [r[1] for r in rm.requests if r[0] == "GET"][-1] == f"/ws/v1/cluster/apps/{YARN_APP}"
    assert outcome.get("result", {}).get("status") == "stopped", outcome
    conf = conf_of(submitted(cluster.calls)[0])
    assert conf["spark.yarn.submit.waitAppCompletion"] == "false"
    assert conf["spark.yarn.appMasterEnv.SPARKPOINT_SUBMITTER"]
    launch = launch_of(cluster.catalog, 1)
    assert launch is not None and dict(launch.driver) == {"kind": "yarn", "application_id": YARN_APP}


def test_a_driver_that_ends_before_its_claim_fails_the_task_naming_it(
        cluster: SimpleNamespace, rm: Any) -> None:
    from airflow.sdk.exceptions import AirflowException

    rm.apps[YARN_APP] = {"state": "FAILED", "finalStatus": "FAILED",
                         "diagnostics": "Application application_1764383000000_0007 failed 2 times: exit 1"}
    with pytest.raises(AirflowException, match=f"YARN application {YARN_APP}.*ended before it claimed"):
        operator("spark_yarn").execute(context(FakeTI(), FakeStore()))
    assert cluster.catalog.current_generation() == 0 and rm.kills() == []


def test_a_driver_judged_ended_before_its_claim_is_named_by_that_judgement(
        cluster: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names what the cluster manager said when it was judged ended, not what a
    second read says a moment later (here: not found, then the pod shows up Running)."""
    from airflow.sdk.exceptions import AirflowException

    cluster.pods.phases[(NAMESPACE, POD)] = "Running"
    real = cluster.pods.read_namespaced_pod
    reads: list[str] = []

    def first_not_found(name: str, namespace: str) -> Any:
        reads.append(name)
        if len(reads) == 1:
            raise ApiException(404, "Not Found")
        return real(name=name, namespace=namespace)

    monkeypatch.setattr(cluster.pods, "read_namespaced_pod", first_not_found)
    with pytest.raises(AirflowException, match="ended before it claimed") as failed:
        operator().execute(context(FakeTI(), FakeStore()))
    assert reads[0] == POD, "the fault (a first read saying not found) was not exercised"
    assert f"pod {NAMESPACE}:{POD} not found" in str(failed.value), str(failed.value)
    assert "phase Running" not in str(failed.value), str(failed.value)
    assert cluster.catalog.current_generation() == 0


def test_a_spark_submit_that_names_no_driver_fails_the_task_with_its_output(
        cluster: SimpleNamespace, rm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    cluster.output("26/11/29 02:40:02 ERROR Client: Application submission failed: queue 'etl' is full\n")
    monkeypatch.setenv("FAKE_SUBMIT_EXIT", "1")
    store = FakeStore()
    with pytest.raises(AirflowException, match=r"failed \(exit 1\) without naming the driver") as failed:
        operator("spark_yarn").execute(context(FakeTI(), store))
    assert "queue 'etl' is full" in str(failed.value)
    assert len(submitted(cluster.calls)) == 1 and cluster.catalog.current_generation() == 0
    assert "sparkpoint_detached" not in store.values and rm.requests == []


# ---------------------------------------------------------------------------- deferred: the trigger


async def _first_event(trig: Any) -> dict[str, Any]:
    async for event in trig.run():
        await trig.cleanup()
        return dict(event.payload)
    raise AssertionError("no event")


def test_deferred_kubernetes_run_the_trigger_cancels_then_deletes_the_pod_and_reports_it_gone(
        cluster: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from airflow_sparkpoint.triggers import run as run_module
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    monkeypatch.setattr(run_module, "STOP_WAIT_S", 1.0)
    op = operator(deferrable=True, poll_interval=10)
    ti, store = FakeTI(), FakeStore()
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="ignore", pods=cluster.pods) as driver:
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context(ti, store))
        path, kwargs = deferred.value.trigger.serialize()
        assert path == run_module.CLASSPATH and kwargs["process"] is None and kwargs["generation"] == 1
        assert kwargs["cluster"] == {"driver": {"kind": "kubernetes", "namespace": NAMESPACE, "pod": POD},
                                     "conn_id": "spark_k8s"}
        assert op._try_state.cluster_run is None, "deferred: the trigger owns the stop, not the task"
        trig = SparkpointRunTrigger(**kwargs)  # as the triggerer builds it from its kwargs

        async def failed(*_args: Any) -> str:
            return "failed"

        trig.state_of = failed
        asyncio.run(trig.on_kill())
        wait_until(driver.ended.is_set, what="the driver's end")
    [(kind, generation, cancelled_at)] = cancels(cluster.catalog)
    deletes = cluster.pods.of("delete")
    assert (kind, generation) == ("cancel", 1) and [d[1:3] for d in deletes] == [(POD, NAMESPACE)]
    assert deletes[0][3] - cancelled_at >= 1.0 - 0.05, "the pod was deleted before the stop bound"

    async def no_wait(_seconds: float, *_args: Any) -> None:
        return None

    monkeypatch.setattr(run_module.asyncio, "sleep", no_wait)
    event = asyncio.run(_first_event(SparkpointRunTrigger(**kwargs)))
    assert event["status"] == "dead" and event["driver"] == f"Kubernetes pod {NAMESPACE}:{POD}", event
    with pytest.raises(AirflowException, match="is gone"):
        op.execute_complete(context(ti, store), event, **deferred.value.kwargs)


def test_the_trigger_owns_the_timeout_of_a_yarn_run_cancel_then_rm_kill(
        cluster: SimpleNamespace, rm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.triggers import run as run_module
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    monkeypatch.setattr(run_module, "STOP_WAIT_S", 1.0)
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="ignore", rm=rm) as driver:
        with pytest.raises(BaseException) as deferred:  # TaskDeferred is a BaseException
            operator("spark_yarn", deferrable=True, poll_interval=10).execute(context(FakeTI(), FakeStore()))
        _path, kwargs = deferred.value.trigger.serialize()  # type: ignore[attr-defined]
        trig = SparkpointRunTrigger(**{**kwargs, "deadline": time.time() - 1})
        event = asyncio.run(_first_event(trig))
        wait_until(driver.ended.is_set, what="the driver's end")
    assert event["status"] == "timeout" and "execution_timeout" in event["message"], event
    [(kind, generation, cancelled_at)] = cancels(cluster.catalog)
    [kill] = rm.kills()
    assert (kind, generation) == ("cancel", 1)
    assert kill[1] == f"/ws/v1/cluster/apps/{YARN_APP}/state" and kill[2] == {"state": "KILLED"}
    assert kill[3] - cancelled_at >= 1.0 - 0.05, "the application was killed before the stop bound"
    assert rm.apps[YARN_APP]["state"] == "KILLED"


def test_a_resumed_deferred_task_re_attaches_to_its_cluster_run(cluster: SimpleNamespace) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_sparkpoint.checkpoints.history import generation_alive

    store = FakeStore()
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="ignore", pods=cluster.pods):
        with pytest.raises(TaskDeferred):
            operator(deferrable=True, poll_interval=10).execute(context(FakeTI(1), store))
        # the task defers at the claim; a run is followed again once it is live (heartbeats)
        wait_until(lambda: generation_alive(cluster.catalog, 1, 60.0),
                   what="try 1's driver's first heartbeat")
        # try 1's worker was lost after the claim, before it deferred: its record names the run,
        # not a deferral (a try that deferred ends only by a user's action, a clear, whose new
        # try restarts the job: tests/unit/airflow/test_submit_deferred_clear.py)
        store.values["sparkpoint_detached"].pop("deferred_try")
        with pytest.raises(TaskDeferred) as again:  # the worker restarted: the task resumes
            operator(deferrable=True, poll_interval=10).execute(context(FakeTI(2), store))
    assert len(submitted(cluster.calls)) == 1, "the resumption submitted a second driver"
    assert cluster.catalog.current_generation() == 1
    kwargs = again.value.trigger.serialize()[1]
    assert kwargs["generation"] == 1 and kwargs["cluster"]["driver"]["pod"] == POD


def test_the_trigger_refuses_a_malformed_cluster_record(cluster: SimpleNamespace) -> None:
    from airflow_sparkpoint.triggers.run import SparkpointRunTrigger

    base = {"job_name": JOB, "generation": 1, "sparkpoint_conn_id": "sp_s3"}
    pod = {"kind": "kubernetes", "namespace": NAMESPACE, "pod": POD}
    with pytest.raises(ConfigError, match="application_<cluster timestamp>"):
        SparkpointRunTrigger(**base,
                             cluster={"driver": {"kind": "yarn", "application_id": "x"}, "conn_id": "c"})
    with pytest.raises(ConfigError, match="a driver and a Spark conn_id"):
        SparkpointRunTrigger(**base, cluster={"driver": pod})
    with pytest.raises(ConfigError, match="process and cluster are both given"):
        SparkpointRunTrigger(**base, cluster={"driver": pod, "conn_id": "spark_k8s"},
                             process={"host": "h", "boot_id": "b", "pgid": 4242, "leader_start": "1",
                                      "log": ""})


# ---------------------------------------------------------------------------- retries fence


def test_a_retry_fences_the_previous_tries_driver_still_running_on_the_cluster(
        cluster: SimpleNamespace, rm: Any, no_process_kill: list[tuple[int, int]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Try 1's worker was lost (nothing stopped its driver, which runs on); try 2 submits
    again: its driver's claim supersedes try 1's, which fails at its next look at the fence.
    Nothing is killed by the retry (no process group, no cluster kill)."""
    from airflow.sdk.exceptions import AirflowException

    store = FakeStore()
    second_app = "application_1764383000000_0008"
    first_try = operator("spark_yarn")
    with ClusterDriver(cluster.catalog, cluster.calls, behaviour="ignore", rm=rm, index=0) as first:
        thread, outcome = in_thread(lambda: first_try.execute(context(FakeTI(1), store)))
        wait_until(lambda: first.generation == 1 and follows(first_try, 1), what="try 1's claim")
        cluster.output(YARN_SUBMIT_OUTPUT.replace(YARN_APP, second_app))
        with ClusterDriver(cluster.catalog, cluster.calls, behaviour="finish", rm=rm, index=1,
                           app=second_app) as second:
            result = operator("spark_yarn").execute(context(FakeTI(2), store))
        wait_until(first.ended.is_set, what="try 1's driver to notice the fence")
        thread.join(30)
    assert first.error is None and second.error is None
    assert result is not None and result["generation"] == 2 and cluster.catalog.current_generation() == 2
    assert first.fenced_at_end is True, "try 1's driver was not fenced by try 2's claim"
    assert rm.kills() == [] and no_process_kill == []
    error = outcome.get("error")
    assert isinstance(error, AirflowException) and "superseded" in str(error), outcome
    assert conf_of(submitted(cluster.calls)[1])["spark.yarn.appMasterEnv.AIRFLOW_CTX_TRY_NUMBER"] == "2"
    assert os.environ.get("FAKE_SUBMIT_OUTPUT")
