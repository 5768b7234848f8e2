"""The `sparkpoint demo` command: where the example DAGs are, the demo's child
processes (adopted, killed on an interrupt) and its entry point, `main`. The stages
themselves are `demo.stages`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_sparkpoint.demo.console import Console
from airflow_sparkpoint.demo.stages import Demo

__all__ = ["main"]


def _dags_folder(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).resolve()
    candidates = [Path(__file__).resolve().parents[2] / "dags", Path.cwd() / "dags"]
    for candidate in candidates:
        if (candidate / "example_sparkpoint_quickstart.py").exists():
            return candidate
    raise SystemExit("demo: cannot find the dags/ folder of the repository; pass --dags PATH")


def _adopt_orphans() -> None:
    """Make this process the child subreaper of what it starts (Linux): on Ctrl-C
    spark-submit's JVM can exit before the Python driver it started, and that orphan must
    become our child, for `_kill_children` to find it, not init's."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans may outlive an interrupted demo
        pass


def _kill_children() -> None:
    """SIGKILL what this process started and is still running (a task's spark-submit, its
    JVM and Python workers); by process id, descendants of this process only."""
    try:
        import psutil
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def _exit_on_interrupt(demo: Demo, console: Console) -> dict[int, Any]:
    """Ctrl-C or SIGTERM kills every process the demo started and exits at once (128 +
    the signal). A KeyboardInterrupt would not do: Airflow's task runner turns one raised
    inside a task into a task failure, and the DAG run goes on (retries included)."""
    def handler(signum: int, frame: Any) -> None:
        console.interrupt_notice("\n   interrupted: killing the processes the demo started")
        demo.blue.kill(wait=False)
        _kill_children()
        os._exit(128 + signum)

    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: signals are the caller's business
        pass
    return previous


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkpoint demo",
                                     description="The guided demo: an incremental ETL "
                                     "resumed by Airflow's retry, a blue-green rollback "
                                     "and a promotion, then the "
                                     "record and an exactly-once verdict.")
    parser.add_argument("--workdir", default="demo-output", help="where everything is written (wiped first)")
    parser.add_argument("--dags", default=None, help="the repository's dags/ folder")
    args = parser.parse_args(list(argv) if argv is not None else None)

    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    home, logs = workdir / "airflow-home", workdir / "logs"
    home.mkdir(parents=True)
    logs.mkdir()
    dags = _dags_folder(args.dags)
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    })
    # Third-party deprecation noise from Airflow's own imports; not the demo's business.
    warnings.filterwarnings("ignore", message="GitWildMatchPattern")
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    console = Console()
    demo = Demo(workdir, dags, console)
    # The blue-green DAG keeps its storage in the `sparkpoint_default` connection, as in production.
    os.environ["AIRFLOW_CONN_SPARKPOINT_DEFAULT"] = json.dumps({"conn_type": "sparkpoint",
                                                                "host": str(demo.blue.root)})
    _adopt_orphans()
    previous_handlers = _exit_on_interrupt(demo, console)
    console.step("airflow-sparkpoint demo: checkpoints, savepoints and exactly-once "
                 "output on Spark + Airflow")
    console.say(f"   workdir   {workdir}")
    console.say(f"   logs      {logs / 'airflow.log'} (Airflow tasks, spark-submit), {demo.blue.log} (blue)")
    console.say("   1. incremental ETL: a driver killed with SIGKILL, Airflow's retry resumes "
                "from the latest checkpoint")
    console.say("   2. blue-green deploy: a failing green is aborted, blue restored from the same savepoint")
    console.say("   3. blue-green deploy: a healthy green is promoted by a two-phase commit")
    console.say("   then the record and the exactly-once verdict, computed from the Delta tables")
    try:
        with console.quiet(logs / "airflow.log"):
            return demo.run()
    except Exception:  # noqa: BLE001 - the demo reports, then fails
        console.say("\n" + traceback.format_exc().rstrip())
        console.say(f"   DEMO FAILED (details in {logs / 'airflow.log'} and {demo.blue.log})")
        return 1
    finally:
        demo.watcher.done.set()
        demo.blue.kill()
        _kill_children()
        if demo.watcher.is_alive():
            demo.watcher.join(timeout=5)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        console.close()
