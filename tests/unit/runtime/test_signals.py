"""SIGTERM in the driver (issue #19): the run records its failed status at once, takes on
nothing new, and the process ends even if the query does not.

A stand-in run object with the attributes `runtime.signals` uses; the real driver
under SIGTERM is `tests/integration/test_driver_sigterm.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.status import read_job_status
from airflow_sparkpoint.runtime import signals
from airflow_sparkpoint.runtime.config import SparkpointConfig
from airflow_sparkpoint.runtime.job import _Run
from airflow_sparkpoint.runtime.run_coordination import RunCoordinator
from airflow_sparkpoint.runtime.signals import Terminated, sigterm_ends_run
from airflow_sparkpoint.storage import MemoryStorage


class FakeRun:
    """A `signals.Terminable` that records what the handler asks of it."""

    def __init__(self, *, generation: int | None = 3, query: bool = True) -> None:
        self.job_name = "orders"
        self.claimed_generation = generation
        self.query_started = query
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.statuses: list[tuple[str, str | None]] = []
        self.stopped = threading.Event()

    def record_terminated(self, reason: str) -> bool:
        self.statuses.append(("failed", reason))
        return True

    def stop_query(self) -> None:
        self.stopped.set()


def test_sigterm_while_the_query_runs_records_failed_and_stops_the_query() -> None:
    run = FakeRun()
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_ends_run(run, exit_grace_s=None):
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        assert run.stopped.wait(30), "the query was not asked to stop"
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor may signal again: no second record
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is put back"
    assert run.statuses == [("failed", "terminated by SIGTERM")]
    assert isinstance(run.error, Terminated) and "generation 3: terminated by SIGTERM" in str(run.error)
    assert run.stopping.is_set()


def test_sigterm_before_the_query_started_records_failed_and_raises() -> None:
    run = FakeRun(query=False)
    with (pytest.raises(Terminated, match="generation 3: terminated by SIGTERM before its query started"),
          sigterm_ends_run(run, exit_grace_s=None)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises here at the latest
        raise AssertionError("the handler did not interrupt the run")
    assert run.statuses == [("failed", "terminated by SIGTERM")]
    assert run.stopping.is_set()


def test_sigterm_before_a_generation_was_claimed_records_nothing() -> None:
    run = FakeRun(generation=None, query=False)
    with (pytest.raises(Terminated, match="before it claimed a generation"),
          sigterm_ends_run(run, exit_grace_s=None)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    assert run.statuses == []


def test_nothing_is_installed_outside_the_main_thread() -> None:
    seen: list[Any] = []

    def body() -> None:
        with sigterm_ends_run(FakeRun()):
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]


def test_a_driver_that_does_not_end_exits_with_143() -> None:
    code = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        sys.path.insert(0, {str(os.getcwd())!r})
        from tests.unit.runtime.test_signals import FakeRun
        from airflow_sparkpoint.runtime.signals import sigterm_ends_run
        run = FakeRun()
        with sigterm_ends_run(run, exit_grace_s=0.5):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(120)  # a query that never stops
        print("ended normally")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 143, done.stderr
    assert "ended normally" not in done.stdout


def test_a_terminating_run_starts_no_checkpoint_commit_or_control_request() -> None:
    calls: list[str] = []
    run: Any = SimpleNamespace(
        error=Terminated("terminated by SIGTERM"),
        checkpointer=SimpleNamespace(checkpoint=lambda batch: calls.append(f"checkpoint {batch}"),
                                     last_checkpoint=None),
        committer=SimpleNamespace(commit_confirmed=lambda checkpoint: calls.append("commit")),
        control=SimpleNamespace(withdraw_superseded=lambda g: calls.append("sweep"),
                                pending=lambda g: calls.append("pending") or []),
    )
    coordinator = RunCoordinator(run)
    coordinator.checkpoint_and_commit(4)
    coordinator.serve_control()
    assert calls == []
    run.error = None
    run.generation, run.cfg = 2, SimpleNamespace(job="orders")
    coordinator.serve_control()
    coordinator.serve_control()
    assert calls == ["sweep", "pending", "pending"], \
        "older generations' requests are withdrawn once, at start"


def test_exit_grace_default_fits_no_supervisor_but_bounds_the_driver() -> None:
    # Airflow SIGKILLs 5 s after SIGTERM; elsewhere (Kubernetes: 30 s) the driver ends by itself.
    assert 5 < signals.EXIT_GRACE_S <= 30


def _real_run(catalog: Catalog) -> _Run:
    """A real `_Run` in the state its start-up leaves before the query (no Spark)."""
    config = SparkpointConfig.from_conf({"spark.sparkpoint.dir": "/unused", "spark.sparkpoint.job": "orders"})
    spark = SimpleNamespace(sparkContext=SimpleNamespace(applicationId="app-1"))
    run = _Run(SimpleNamespace(config=config, spark=spark), None, None, "append", None)  # type: ignore[arg-type]
    run.state.catalog, run.state.generation = catalog, catalog.claim_generation().generation
    return run


def test_sigterm_to_a_real_run_records_its_failed_status() -> None:
    """The handler ends the status of a real `_Run` (not a stand-in shaped like the one
    the handler probes): once its start-up built the checkpointer, SIGTERM records
    ``failed`` for its generation, while the query runs and before it started."""
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    run = _real_run(catalog)
    run.state.checkpointer = SimpleNamespace(last_checkpoint=None, confirmed_batch=None,  # type: ignore[assignment]
                                             checkpoints_completed=0)
    stopped = threading.Event()
    run.state.query = SimpleNamespace(stop=stopped.set)  # type: ignore[assignment]
    assert signals.terminate(run, exit_grace_s=None)
    assert stopped.wait(30), "the query was not asked to stop"
    status = read_job_status(catalog)
    assert status is not None and (status.generation, status.state, status.error) == (
        run.state.generation, "failed", "terminated by SIGTERM")

    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    run = _real_run(catalog)
    run.state.checkpointer = SimpleNamespace(last_checkpoint=None, confirmed_batch=None,  # type: ignore[assignment]
                                             checkpoints_completed=0)
    with (pytest.raises(Terminated, match="before its query started"),
          sigterm_ends_run(run, exit_grace_s=None)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    status = read_job_status(catalog)
    assert status is not None and (status.state, status.error) == ("failed", "terminated by SIGTERM")


def test_sigterm_to_a_real_run_before_its_checkpointer_leaves_the_status_to_the_start_up() -> None:
    """Between the claim and the checkpointer, the handler raises in the start-up, whose
    failure path writes the status (`_Run.execute`): the handler itself writes none."""
    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), "orders")
    run = _real_run(catalog)
    with (pytest.raises(Terminated,
                        match=f"generation {run.state.generation}: terminated by SIGTERM "
                              "before its query started"),
          sigterm_ends_run(run, exit_grace_s=None)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    assert read_job_status(catalog) is None
