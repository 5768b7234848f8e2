"""The Airflow path (issue 18): operator overhead and the load of waiting sensors.

**Operator.** The same application (``dags/jobs/quickstart_totals.py``: running totals
into Delta, a retained checkpoint after every batch, real ``spark-submit``, ``local[2]``)
as a one-task DAG under ``dag.test()``, submitted by `SparkpointSubmitOperator` and by
the Spark provider's plain `SparkSubmitOperator` given the same ``spark.sparkpoint.*``
conf. Both runs do the same Spark work; the difference is what the operator adds (submit
token, finding its generation, reading the run result, XCom). A round runs each once, in
alternating order, on a fresh storage root and table; the ratio is the median of the
rounds' Sparkpoint ÷ plain wall times (``dag.test()`` start to end). Target: ≤ 1.05.

**Sensors.** ``--sensors`` `SparkpointCheckpointTrigger` instances wait at once in one
asyncio loop (as in a triggerer) for a checkpoint that never comes, against a catalog with
``--checkpoints`` retained checkpoints, on local disk (storage calls counted by a
wrapper) and on SeaweedFS (its own process; HTTP requests counted at botocore), for ``--seconds``.
Reported: requests per minute per waiting sensor in the second half of the window (the
steady state: the first half includes every trigger's start), and the event loop's worst lag.

    .venv/bin/python benchmarks/bench_airflow.py [--rounds 3] [--warmup 1] [--sensors 100] [--seconds 60]
    [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _bench import emit, median
from _scale import seaweedfs

TARGET = 1.05
JOB = "quickstart"


def _airflow_home(tmp: Path) -> None:
    os.environ.update({
        "AIRFLOW_HOME": str(tmp / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYSPARK_PYTHON": sys.executable,
        # the provider's SparkSubmitOperator runs `spark-submit` from PATH (pyspark's, in this venv)
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    })
    from airflow.utils import db

    db.resetdb()


def _events(directory: Path, files: int, users: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path = directory / f"events-{i:05d}.json"
        path.write_text("".join(json.dumps({"user": f"u{u}", "amount": i * 10 + u}) + "\n"
                                for u in range(users)))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def _dag_run(kind: str, base: Path, index: int) -> float:
    from datetime import datetime

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import DAG

    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    work = base / f"{kind}-{index}"
    work.mkdir(parents=True)
    common = {
        "application": str(REPO / "dags" / "jobs" / "quickstart_totals.py"),
        "application_args": ["--input", str(base / "input"), "--output", str(work / "output")],
    }
    spark_conf = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN",
                  "spark.pyspark.python": sys.executable}
    with DAG(dag_id=f"bench_{kind}_{index}", schedule=None, start_date=datetime(2026, 1, 1),
             catchup=False) as dag:
        if kind == "sparkpoint":
            SparkpointSubmitOperator(task_id="job", job_name=JOB, checkpoint_dir=str(work / "checkpoints"),
                                     work_dir=str(work / "live"), conf=spark_conf, **common)
        else:
            SparkSubmitOperator(task_id="job", conf={
                **spark_conf, "spark.sparkpoint.dir": str(work / "checkpoints"), "spark.sparkpoint.job": JOB,
                "spark.sparkpoint.workDir": str(work / "live"), "spark.sparkpoint.restore": "latest",
                "spark.sparkpoint.checkpoint.interval": "0", "spark.sparkpoint.checkpoint.numRetained": "3",
                "spark.sparkpoint.trigger": "availableNow",
            }, **common)
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:  # dag.test() needs the DAG serialized first (not timed)
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.commit()
        update_dag_parsing_results_in_db("dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None,
                                         set(), session=session)
    started = time.perf_counter()
    run = dag.test()
    elapsed = time.perf_counter() - started
    if run.state != "success":
        raise RuntimeError(f"{kind} run {index} ended {run.state}")
    from deltalake import DeltaTable

    rows = DeltaTable(str(work / "output")).to_pyarrow_dataset().count_rows()
    if rows <= 0:
        raise RuntimeError(f"{kind} run {index} wrote no rows")
    return elapsed


def operator_overhead(base: Path, rounds: int, warmup: int, files: int, users: int) -> dict[str, Any]:
    _events(base / "input", files, users)
    times: dict[str, list[float]] = {"sparkpoint": [], "plain": []}
    for attempt in range(warmup + rounds):
        for kind in (("sparkpoint", "plain") if attempt % 2 == 0 else ("plain", "sparkpoint")):
            took = _dag_run(kind, base, attempt)
            if attempt >= warmup:
                times[kind].append(took)
            print(f"  dag.test {kind:<10} round {attempt}{' (warm-up)' if attempt < warmup else ''}: "
                  f"{took:.1f} s",
                  file=sys.stderr, flush=True)
    ratios = [s / p for s, p in zip(times["sparkpoint"], times["plain"], strict=True)]
    return {"median_s": {k: median(v) for k, v in times.items()}, "all_s": times, "round_ratios": ratios,
            "ratio": median(ratios), "files": files, "users": users, "rounds": rounds, "warmup": warmup}


# ---------------------------------------------------------------------------- sensors

def _seed_catalog(root: str, checkpoints: int, **options: Any) -> int:
    """A job with `checkpoints` completed checkpoints; returns the newest id."""
    from airflow_sparkpoint.checkpoints import Catalog, FileRef, SnapshotMetadata, SnapshotStats

    catalog = Catalog.open(root, JOB, **options)
    generation = catalog.claim_generation().generation
    newest = 0
    for batch in range(checkpoints):
        data = f"changelog {batch}".encode().ljust(100, b".")
        sha, path = hashlib.sha256(data).hexdigest(), f"state/0/0/{batch + 1}.changelog"
        key = catalog.shared_key(path, sha)
        catalog.store.put(key, data)
        ref = FileRef(path=path, key=key, size=100, sha256=sha, mtime_ns=1)
        meta = SnapshotMetadata(kind="checkpoint", id=catalog.next_checkpoint_id(), job=JOB,
                                generation=generation,
                                batch_id=batch, created_at=time.time(), files=(ref,), live_root="/tmp/live",
                                transactions=(), sink_positions={},
                                stats=SnapshotStats(duration_ms=1, bytes_copied=100, files_copied=1,
                                                    bytes_total=100, file_count=1), spark={})
        catalog.complete_checkpoint(meta)
        newest = meta.id
    return newest


async def _wait_all(triggers: list[Any], seconds: float, counts: dict[str, int]) -> dict[str, Any]:
    """Drive the triggers for `seconds`; the second half is the steady state measured
    (the first includes each trigger's start: hook, catalog, S3 client)."""
    lag = steady_lag = 0.0
    start = time.monotonic()
    half, stop = start + seconds / 2, start + seconds
    events = 0
    mark: tuple[float, int] | None = None

    async def drive(trigger: Any) -> None:
        nonlocal events
        async for _event in trigger.run():
            events += 1
            return

    tasks = [asyncio.create_task(drive(t)) for t in triggers]
    while time.monotonic() < stop:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        late = time.monotonic() - before - 0.1
        lag = max(lag, late)
        if mark is None and time.monotonic() >= half:
            mark = (time.monotonic(), counts["calls"])
        elif mark is not None:
            steady_lag = max(steady_lag, late)
    assert mark is not None
    steady = {"steady_seconds": time.monotonic() - mark[0], "steady_requests": counts["calls"] - mark[1]}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"max_loop_lag_s": lag, "steady_loop_lag_s": steady_lag, "events": events, **steady}


def sensor_load(base: Path, sensors: int, seconds: float, checkpoints: int,
                poll: float) -> list[dict[str, Any]]:
    from botocore.client import BaseClient

    from airflow_sparkpoint.storage.local import LocalStorage
    from airflow_sparkpoint.triggers.checkpoint import SparkpointCheckpointTrigger

    counts = {"calls": 0}
    results = []
    original_call = BaseClient._make_api_call

    def counting_call(client: Any, operation: str, params: Any) -> Any:
        counts["calls"] += 1
        return original_call(client, operation, params)

    wrapped = {}
    for name in ("get", "stat", "list", "list_dirs", "put", "put_if_absent", "delete", "exists"):
        original = getattr(LocalStorage, name)

        def make(fn: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> Any:
                counts["calls"] += 1
                return fn(*args, **kwargs)
            return counted
        wrapped[name] = original
        setattr(LocalStorage, name, make(original))
    server = None
    try:
        for backend in ("local", "s3"):
            if backend == "local":
                root, options = str(base / "sensor-root"), {}
            else:
                # Out of process: an in-process server would share the GIL with the loop measured.
                server = seaweedfs("sensors")
                endpoint, _bucket, _version = server.__enter__()
                os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
                root, options = "s3://sensors/root", {"endpoint_url": endpoint}
                BaseClient._make_api_call = counting_call  # type: ignore[method-assign]
            newest = _seed_catalog(root, checkpoints, **options)
            triggers = [SparkpointCheckpointTrigger(job_name=JOB, checkpoint_dir=root,
                                                    after_checkpoint_id=newest,
                                                    poll_interval=poll) for _ in range(sensors)]
            counts["calls"] = 0
            started = time.monotonic()
            outcome = asyncio.run(_wait_all(triggers, seconds, counts))
            elapsed = time.monotonic() - started
            calls = counts["calls"]
            per_min = outcome["steady_requests"] / (outcome["steady_seconds"] / 60) / sensors
            results.append({"backend": backend, "sensors": sensors, "seconds": elapsed,
                            "poll_interval_s": poll, "retained_checkpoints": checkpoints, "requests": calls,
                            "requests_per_min_per_sensor": per_min,
                            "polls_per_min_per_sensor_nominal": 60 / poll,
                            "requests_per_poll": per_min / (60 / poll), **outcome})
            print(f"  sensors {backend}: {calls} requests in {elapsed:.0f} s; steady state (second half) "
                  f"{per_min:.1f}/min per sensor, loop lag max {outcome['max_loop_lag_s'] * 1000:.0f} ms "
                  f"(steady {outcome['steady_loop_lag_s'] * 1000:.0f} ms)", file=sys.stderr, flush=True)
    finally:
        BaseClient._make_api_call = original_call  # type: ignore[method-assign]
        for name, fn in wrapped.items():
            setattr(LocalStorage, name, fn)
        if server is not None:
            server.__exit__(None, None, None)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--files", type=int, default=4, help="input files (micro-batches) of the job")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--checkpoints", type=int, default=10,
                        help="retained checkpoints the sensors look at")
    parser.add_argument("--poll", type=float, default=5.0, help="the triggers' poll_interval (their default)")
    parser.add_argument("--skip-operator", action="store_true")
    parser.add_argument("--skip-sensors", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sparkpoint-airflow-bench-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        _airflow_home(base)
        sensors = [] if args.skip_sensors else sensor_load(base, args.sensors, args.seconds, args.checkpoints,
                                                           args.poll)
        operator = None if args.skip_operator else operator_overhead(base, args.rounds, args.warmup,
                                                                     args.files,
                                                                      args.users)
    ok = operator is None or operator["ratio"] <= TARGET
    result = {"name": "airflow", "operator": operator, "sensors": sensors, "target": f"<= {TARGET}",
              "pass": ok, "summary": (f"SparkpointSubmitOperator / SparkSubmitOperator under dag.test() = "
                          f"{operator['ratio']:.3f} (target <= {TARGET})" if operator
                          else "operator not measured")}
    lines = []
    if operator:
        lines.append(f"dag.test(): SparkpointSubmitOperator {operator['median_s']['sparkpoint']:.1f} s, "
                     f"SparkSubmitOperator {operator['median_s']['plain']:.1f} s; per round "
                     + ", ".join(f"{r:.3f}" for r in operator["round_ratios"]))
    for s in sensors:
        lines.append(f"{s['sensors']} waiting sensors on {s['backend']}: "
                     f"{s['requests_per_min_per_sensor']:.1f} "
                     f"requests/min per sensor ({s['requests_per_poll']:.1f} per poll, poll every "
                     f"{s['poll_interval_s']:g} s), event loop lag max {s['max_loop_lag_s'] * 1000:.0f} ms")
    emit(result, args.json, lines)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
