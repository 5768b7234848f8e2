"""The guided demo behind ``make demo`` / ``sparkpoint demo``.

Runs the quickstart DAG with Airflow (``dag.test``, SQLite metadata database) on local
Spark and local storage under ``--workdir``: the first try's driver is killed with
SIGKILL after a few micro-batches, Airflow retries, the retry resumes from the latest
retained checkpoint, and the Delta table is checked for exactly-once output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCHES = 8
USERS = 4
KILL_AFTER = 3
BASE_MTIME = 1_700_000_000


def _say(message: str = "") -> None:
    print(message, flush=True)


def _step(message: str) -> None:
    _say(f"\n== {message}")


def _dags_folder(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).resolve()
    candidates = [Path(__file__).resolve().parents[1] / "dags", Path.cwd() / "dags"]
    for candidate in candidates:
        if (candidate / "example_sparkpoint_quickstart.py").exists():
            return candidate
    raise SystemExit("demo: cannot find the dags/ folder of the repository; pass --dags PATH")


def _write_input(directory: Path) -> dict[str, tuple[int, int]]:
    directory.mkdir(parents=True, exist_ok=True)
    expected: dict[str, tuple[int, int]] = {}
    for i in range(BATCHES):
        path = directory / f"events-{i:05d}.json"
        rows = [(f"user-{u}", (i + 1) * (u + 1)) for u in range(USERS)]
        path.write_text("".join(json.dumps({"user": user, "amount": amount}) + "\n" for user, amount in rows))
        os.utime(path, (BASE_MTIME + i, BASE_MTIME + i))  # one file per batch, in order
        for user, amount in rows:
            total, events = expected.get(user, (0, 0))
            expected[user] = (total + amount, events + 1)
    return expected


class _Progress(threading.Thread):
    """Prints what the job is doing every few seconds, read from its status record."""

    def __init__(self, checkpoint_dir: Path, job: str) -> None:
        super().__init__(daemon=True)
        self.checkpoint_dir = checkpoint_dir
        self.job = job
        self.done = threading.Event()
        self.started = time.monotonic()

    def run(self) -> None:
        from airflow_sparkpoint.checkpoints import Catalog

        last = None
        while not self.done.wait(3):
            line = "waiting for spark-submit to start the driver"
            if (self.checkpoint_dir / self.job / "status.json").exists():
                status = Catalog.open(str(self.checkpoint_dir), self.job).read_status() or {}
                line = (
                    f"generation {status.get('generation')}: {status.get('state')}, "
                    f"last confirmed batch {status.get('last_batch')}, "
                    f"last checkpoint chk-{status.get('last_checkpoint_id')}"
                )
            if line != last:
                _say(f"   [{time.monotonic() - self.started:5.0f}s] {line}")
                last = line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkpoint demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="demo-output", help="where everything is written (wiped first)")
    parser.add_argument("--dags", default=None, help="the repository's dags/ folder")
    args = parser.parse_args(list(argv) if argv is not None else None)

    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    base = workdir / "quickstart"
    home = workdir / "airflow-home"
    home.mkdir(parents=True)
    dags = _dags_folder(args.dags)
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # The test-only fault hook: kill the first try's driver once batch KILL_AFTER is
        # confirmed by Spark, before Sparkpoint checkpointed it; the retry runs clean.
        "SPARKPOINT_TEST_FAULT": f"confirmed:{KILL_AFTER}",
        "SPARKPOINT_TEST_FAULT_ONCE": str(workdir / "fault-fired"),
    })

    # Third-party deprecation noise from Airflow's own imports; not the demo's business.
    warnings.filterwarnings("ignore", message="GitWildMatchPattern")
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    _step("airflow-sparkpoint demo: a retry that resumes instead of starting over")
    _say(f"   workdir     {workdir}")
    expected = _write_input(base / "input")
    _say(f"   input       {BATCHES} JSON files x {USERS} users -> {BATCHES} micro-batches")
    _say(f"   fault       the first try's driver gets SIGKILL after batch {KILL_AFTER} is confirmed")

    _step("preparing Airflow (SQLite metadata database)")
    from airflow.utils import db

    db.resetdb()
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(dags)).get_dag("example_sparkpoint_quickstart")
    if dag is None:
        _say("demo: DAG example_sparkpoint_quickstart did not load")
        return 1

    _step("running DAG example_sparkpoint_quickstart (task retries=1)")
    progress = _Progress(base / "checkpoints", "quickstart")
    progress.start()
    started = time.monotonic()
    try:
        run = dag.test(run_conf={"base_dir": str(base)})
    finally:
        progress.done.set()
    elapsed = time.monotonic() - started
    tis = run.get_task_instances()
    ti = tis[0]
    _say(f"   DAG run {run.state} in {elapsed:.0f}s; task {ti.task_id}: {ti.state} on try {ti.try_number}")
    return _report(base, expected, workdir, run.state == "success")


def _report(base: Path, expected: dict[str, tuple[int, int]], workdir: Path, succeeded: bool) -> int:
    from deltalake import DeltaTable

    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.status import result_key

    catalog = Catalog.open(str(base / "checkpoints"), "quickstart")
    _step("what happened")
    fired = (workdir / "fault-fired").exists()
    _say(f"   injected failure: {'yes' if fired else 'NO'} (driver killed at batch {KILL_AFTER})")
    results: dict[int, dict[str, Any]] = {}
    for generation in range(1, catalog.current_generation() + 1):
        try:
            results[generation] = json.loads(catalog.store.get(result_key(generation)))
        except Exception:  # noqa: BLE001 - a killed run leaves no result
            results[generation] = {}
    for generation, result in results.items():
        if not result:
            _say(f"   generation {generation}: killed before it finished (no run result)")
        else:
            _say(
                f"   generation {generation}: {result['status']}, restored from "
                f"{result.get('restored_from') or 'empty state'}; ran batches {result['first_batch']}.."
                f"{result['last_batch']} ({result['batches_processed']} batches), "
                f"committed {result['committed_batches']}"
            )
    _step("retained checkpoints (newest first)")
    _say(f"   {'id':>4} {'batch':>5} {'gen':>3} {'duration':>9} {'copied':>10} {'total':>10} {'files':>5}")
    for meta in catalog.checkpoints():
        s = meta.stats
        _say(f"   {meta.id:>4} {meta.batch_id:>5} {meta.generation:>3} {s.duration_ms:>7}ms "
             f"{s.bytes_copied:>9}B {s.bytes_total:>9}B {s.file_count:>5}")
    _step("Delta table")
    table = DeltaTable(str(base / "output"))
    got = {r["user"]: (r["total"], r["events"]) for r in table.to_pyarrow_table().to_pylist()}
    _say(f"   version {table.version()}, job transaction version {table.transaction_version('quickstart')}")
    for user in sorted(expected):
        mark = "ok" if got.get(user) == expected[user] else "WRONG"
        _say(f"   {user}: total={got.get(user, ('-', '-'))[0]} events={got.get(user, ('-', '-'))[1]} "
             f"(expected {expected[user][0]}/{expected[user][1]}) {mark}")
    exact = got == expected
    last = results.get(max(results) if results else 0, {})
    resumed = bool(last) and last.get("first_batch", 0) > 0
    _step("verdict")
    _say(f"   exactly-once output: {'YES' if exact else 'NO'}; "
         f"retry resumed at batch {last.get('first_batch')} instead of 0: {'YES' if resumed else 'NO'}")
    ok = succeeded and fired and exact and resumed
    _say("   DEMO PASSED" if ok else "   DEMO FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
