"""Processes a task started on this worker: signal spark-submit and what it started.
No Spark, no Airflow."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

__all__ = ["signal_tree", "terminate_tree"]


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to process `pid` and its descendants (spark-submit's JVM and the
    Python driver it started), ignoring those already gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in processes:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def terminate_tree(process: subprocess.Popen[Any], timeout_s: float, *, poll_s: float = 0.1) -> bool:
    """SIGTERM `process` (spark-submit) and its descendants while it runs, and give it
    `timeout_s` seconds to end; whether it ended (False also when it had ended before)."""
    if process.poll() is not None:
        return False
    signal_tree(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(poll_s)
    return process.poll() is not None
