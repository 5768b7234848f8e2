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
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sparkpoint.runtime import signals
from airflow_sparkpoint.runtime.job import _Run
from airflow_sparkpoint.runtime.signals import Terminated, sigterm_ends_run


class FakeRun:
    def __init__(self, *, generation: int | None = 3, query: bool = True) -> None:
        self.cfg = SimpleNamespace(job="orders")
        if generation is not None:
            self.generation = generation
            self.coordinator = object()
        self.query = object() if query else None
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.statuses: list[tuple[str, str | None]] = []
        self.stopped = threading.Event()

    def _write_status(self, state: str, error: str | None = None) -> None:
        self.statuses.append((state, error))

    def _stop_query(self) -> None:
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
    with pytest.raises(Terminated, match="before it claimed a generation"), sigterm_ends_run(run, exit_grace_s=None):
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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 143, done.stderr
    assert "ended normally" not in done.stdout


def test_a_terminating_run_starts_no_checkpoint_commit_or_control_request() -> None:
    calls: list[str] = []
    run: Any = SimpleNamespace(
        error=Terminated("terminated by SIGTERM"),
        checkpointer=SimpleNamespace(checkpoint=lambda batch: calls.append(f"checkpoint {batch}"), last_checkpoint=None),
        committer=SimpleNamespace(commit_confirmed=lambda checkpoint: calls.append("commit")),
        control=SimpleNamespace(withdraw_superseded=lambda g: calls.append("sweep"),
                                pending=lambda g: calls.append("pending") or []),
    )
    _Run._checkpoint_and_commit(run, 4)
    _Run._serve_control(run)
    assert calls == []
    run.error = None
    run.generation, run.cfg = 2, SimpleNamespace(job="orders")
    _Run._serve_control(run)
    _Run._serve_control(run)
    assert calls == ["sweep", "pending", "pending"], "older generations' requests are withdrawn once, at start"


def test_exit_grace_default_fits_no_supervisor_but_bounds_the_driver() -> None:
    # Airflow SIGKILLs 5 s after SIGTERM; elsewhere (Kubernetes: 30 s) the driver ends by itself.
    assert 5 < signals.EXIT_GRACE_S <= 30
