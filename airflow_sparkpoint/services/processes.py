"""Processes a task started on this worker: signal spark-submit and what it started.
No Spark, no Airflow."""

from __future__ import annotations

import signal

__all__ = ["signal_tree"]


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
