"""The Airflow path under a real scheduler (issue 18): `SparkpointSubmitOperator` vs the
Spark provider's `SparkSubmitOperator`, each a one-task DAG run by Airflow 3 as a user runs
it on one machine: ``airflow api-server``, ``scheduler`` (LocalExecutor, so each task is a
supervised worker process), ``dag-processor`` and ``triggerer`` on loopback (the e2e
suite's `tests.e2e.stack.AirflowStack`).

Both DAGs submit the same application (``dags/jobs/quickstart_totals.py``: running
totals into Delta, a retained checkpoint after every batch, real ``spark-submit``,
``local[2]``) with the same ``spark.sparkpoint.*`` conf, on a fresh storage root and
table per run (``dag_run.conf["work"]``). A round triggers each once, in alternating
order, through the REST API. Reported per run: the task instance's duration (its start
to its end as Airflow records them: what the operator adds on top of spark-submit) and
the DAG run's wall time (trigger to end, scheduling included). The ratio is the median
of the rounds' Sparkpoint ÷ plain task durations. Target: ≤ 1.05.

    .venv/bin/python benchmarks/bench_airflow_scheduler.py [--rounds 3] [--warmup 1] [--files 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from _bench import emit, median
from bench_airflow import _events  # the same input files as the dag.test() benchmark

TARGET = 1.05

DAG_FILE = '''
import sys
from datetime import datetime

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from airflow_sparkpoint.operators import SparkpointSubmitOperator

WORK = "{{{{ dag_run.conf['work'] }}}}"
COMMON = {{
    "application": {app!r},
    "application_args": ["--input", {inputs!r}, "--output", WORK + "/output"],
}}
SPARK = {{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.log.level": "WARN",
          "spark.pyspark.python": sys.executable}}

with DAG("bench_sparkpoint", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    SparkpointSubmitOperator(task_id="job", job_name="quickstart", checkpoint_dir=WORK + "/checkpoints",
                             work_dir=WORK + "/live", conf=SPARK, **COMMON)

with DAG("bench_plain", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    SparkSubmitOperator(task_id="job", conf={{
        **SPARK, "spark.sparkpoint.dir": WORK + "/checkpoints", "spark.sparkpoint.job": "quickstart",
        "spark.sparkpoint.workDir": WORK + "/live", "spark.sparkpoint.restore": "latest",
        "spark.sparkpoint.checkpoint.interval": "0", "spark.sparkpoint.checkpoint.numRetained": "3",
        "spark.sparkpoint.trigger": "availableNow",
    }}, **COMMON)
'''


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        raise RuntimeError(f"no start/end recorded ({start!r}, {end!r})")
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _run(api: Any, kind: str, work: Path) -> tuple[float, float]:
    """Trigger `kind`'s DAG on `work`; return (task duration, DAG run wall time)."""
    from deltalake import DeltaTable

    dag_id = f"bench_{kind}"
    work.mkdir(parents=True)  # the sink refuses a table whose parent directory is missing
    run_id = api.trigger(dag_id, conf={"work": str(work)})
    state = api.wait_run(dag_id, run_id, timeout=900)
    if state != "success":
        raise RuntimeError(f"{dag_id} {run_id} ended {state}:\n{api.describe(dag_id, run_id)}")
    ti = api.task_instance(dag_id, run_id, "job")
    run = api.run(dag_id, run_id)
    if DeltaTable(str(work / "output")).to_pyarrow_dataset().count_rows() <= 0:
        raise RuntimeError(f"{dag_id} {run_id} wrote no rows")
    return _seconds(ti["start_date"], ti["end_date"]), _seconds(run.get("queued_at") or run["start_date"],
                                                                 run["end_date"])


def run(rounds: int, warmup: int, files: int, users: int) -> dict[str, Any]:
    from tests.e2e.cluster import spark_home
    from tests.e2e.stack import VENV_BIN, AirflowStack

    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-airflow-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        _events(base / "input", files, users)
        dags = base / "dags"
        dags.mkdir()
        (dags / "bench_dags.py").write_text(DAG_FILE.format(
            app=str(REPO / "dags" / "jobs" / "quickstart_totals.py"), inputs=str(base / "input")))
        stack = AirflowStack(home=base / "airflow", bundles={"bench": dags}, extra_env={
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(spark_home()),
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", os.defpath)]),
        })
        (base / "airflow").mkdir()
        times: dict[str, list[float]] = {"sparkpoint": [], "plain": []}
        walls: dict[str, list[float]] = {"sparkpoint": [], "plain": []}
        try:
            stack.start()
            print(f"  Airflow stack up in {stack.started_in:.0f} s", file=sys.stderr, flush=True)
            api = stack.api()
            for dag_id in ("bench_sparkpoint", "bench_plain"):
                api.wait_dag(dag_id)
                api.unpause(dag_id)
            for attempt in range(warmup + rounds):
                for kind in (("sparkpoint", "plain") if attempt % 2 == 0 else ("plain", "sparkpoint")):
                    took, wall = _run(api, kind, base / f"{kind}-{attempt}")
                    if attempt >= warmup:
                        times[kind].append(took)
                        walls[kind].append(wall)
                    print(f"  scheduler {kind:<10} round "
                          f"{attempt}{' (warm-up)' if attempt < warmup else ''}: "
                          f"task {took:.1f} s, run {wall:.1f} s", file=sys.stderr, flush=True)
            started_in = stack.started_in
        finally:
            stack.stop()
    ratios = [s / p for s, p in zip(times["sparkpoint"], times["plain"], strict=True)]
    ratio = median(ratios)
    return {
        "name": "airflow_scheduler", "files": files, "users": users, "rounds": rounds, "warmup": warmup,
        "median_s": {k: median(v) for k, v in times.items()}, "all_s": times,
        "median_run_s": {k: median(v) for k, v in walls.items()}, "all_run_s": walls,
        "round_ratios": ratios, "ratio": ratio, "stack_start_s": started_in,
        "target": f"<= {TARGET}", "pass": ratio <= TARGET,
        "summary": "SparkpointSubmitOperator / SparkSubmitOperator under a scheduler = "
                   f"{ratio:.3f} (target <= {TARGET})",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--files", type=int, default=4, help="input files (one micro-batch each)")
    parser.add_argument("--users", type=int, default=1000, help="events per file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.rounds, args.warmup, args.files, args.users)
    result["seconds"] = time.monotonic() - started
    emit(result, args.json, [
        (f"The Airflow path under a real scheduler (LocalExecutor), {args.rounds} rounds "
        f"after {args.warmup} warm-up:"),
        (f"  SparkpointSubmitOperator task {result['median_s']['sparkpoint']:6.1f} s   "
         f"(DAG run {result['median_run_s']['sparkpoint']:.1f} s)"),
        (f"  SparkSubmitOperator task      {result['median_s']['plain']:6.1f} s   "
         f"(DAG run {result['median_run_s']['plain']:.1f} s)"),
        "  Sparkpoint ÷ plain per round: " + ", ".join(f"{r:.3f}" for r in result["round_ratios"]),
    ])
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
