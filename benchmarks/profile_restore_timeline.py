"""Where a restore's wall time goes outside Spark (issue 18): a timeline of one Sparkpoint
restore from a savepoint and one cold start, alternating, with the S3 requests of each.

The state is built as in `bench_scale.py` (``--keys`` keys, 9 updates of 5 %, a retained
checkpoint per batch), then a savepoint; each round restores it under a fresh root and
runs one new batch, then a cold start runs the same batch. Sparkpoint's steps (the run's
phases, the catalog's reads and writes, the coordinator's checkpoint) are timed by
wrapping them, and its log lines are stamped on the same clock, per thread: the
background copy of the restored files (``sparkpoint-prestore``) shows beside Spark's batch.

    .venv/bin/python benchmarks/profile_restore_timeline.py [--keys 2000000] [--store s3|local] [--runs 2]
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale
from _bench import fresh, spark_session
from _scale import Profiler, load_batches, seaweedfs, update_batches, write_numeric_batches


class Timeline:
    """(seconds since `reset`, thread, event) of wrapped calls and Sparkpoint's log lines."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []
        self.requests: collections.Counter[str] = collections.Counter()
        self._t0 = time.perf_counter()

    def reset(self) -> None:
        self.events.clear()
        self.requests.clear()
        self._t0 = time.perf_counter()

    def mark(self, what: str) -> None:
        self.events.append((time.perf_counter() - self._t0, threading.current_thread().name, what))

    def wrap(self, owner: Any, name: str, label: str = "") -> None:
        fn: Callable[..., Any] = getattr(owner, name)
        shown = label or name

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.mark(f"{shown} {time.perf_counter() - started:.3f} s")

        setattr(owner, name, timed)

    def install(self) -> Timeline:
        from airflow_sparkpoint.checkpoints import catalog
        from airflow_sparkpoint.runtime import (
            checkpointer,
            committer,
            job,
            prestore,
            run_coordination,
            run_startup,
        )
        from airflow_sparkpoint.storage import s3

        # run_startup imports the restore steps by name: wrap them where they are looked up
        for name in ("plan_restore", "settle_unconfirmed", "fill_live", "recover_transactions",
                     "choose_live"):
            self.wrap(run_startup, name)
        for name in ("open", "prepare"):
            self.wrap(run_startup.RunStartup, name, f"run.{name}")
        self.wrap(run_coordination.RunCoordinator, "finish", "run.finish")
        for name in ("conclude", "_run_query"):
            self.wrap(job._Run, name, f"run.{name}")
        for name in ("claim_generation", "write_origin", "complete_checkpoint"):
            self.wrap(catalog.Catalog, name, f"catalog.{name}")
        # the checkpointer looks retention up on the module it imported
        self.wrap(checkpointer, "enforce_checkpoint_retention", "retention.enforce_checkpoint_retention")
        self.wrap(checkpointer.Checkpointer, "_checkpoint", "checkpointer._checkpoint")
        self.wrap(prestore.Prestore, "wait", "prestore.wait")
        self.wrap(committer.Committer, "commit_confirmed", "committer.commit_confirmed")
        make_client = s3.S3Storage._make_client
        requests = self.requests

        def counted(store: Any) -> Any:
            client = make_client(store)
            client.meta.events.register("before-call.s3", lambda **kw: requests.update([kw["model"].name]))
            return client

        s3.S3Storage._make_client = counted  # type: ignore[method-assign]
        timeline = self

        class Lines(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                timeline.mark("log: " + record.getMessage()[:150])

        logger = logging.getLogger("airflow_sparkpoint")
        logger.addHandler(Lines())
        logger.setLevel(logging.INFO)
        return self


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--store", choices=("s3", "local"), default="s3")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    timeline = Timeline().install()
    with tempfile.TemporaryDirectory(prefix="sparkpoint-timeline-") as tmp:
        s3cm = seaweedfs() if args.store == "s3" else None
        s3 = s3cm.__enter__()[:2] if s3cm is not None else None
        endpoint = s3[0] if s3 else None
        spark = spark_session("restore-timeline", extra={
            "spark.driver.memory": "6g", "spark.sql.streaming.stateStore.maintenanceInterval": "30s"})
        Profiler().install().listen(spark)
        try:
            from airflow_sparkpoint.checkpoints import Catalog

            base = Path(tmp)
            history = load_batches(args.keys, 5_000_000) + update_batches(args.keys, 0.05, 9, seed=1)
            write_numeric_batches(base / "input", history)
            root = bench_scale._root(args.store, base, s3, "origin")
            took, _ = bench_scale._run_job(spark, base / "input", base / "origin-out", bench_scale._conf(
                root, base / "origin-work", "latest", len(history) + 10, endpoint))
            print(f"state of {args.keys:,} keys built in {took:.0f} s", flush=True)
            catalog = Catalog.open(root, bench_scale.JOB, **({"endpoint_url": endpoint} if endpoint else {}))
            savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
            extra = update_batches(args.keys, 0.05, 1, seed=99)
            write_numeric_batches(base / "input", extra, start=len(history))
            write_numeric_batches(base / "cold-input", extra, start=len(history))
            for attempt in range(args.runs):
                for name in ("restore", "cold"):
                    work = fresh(base / f"{name}-{attempt}")
                    restore = savepoint.uri if name == "restore" else "latest"
                    if name == "restore":
                        shutil.copytree(base / "origin-out", work / "out", copy_function=os.link)
                    timeline.reset()
                    took, _ = bench_scale._run_job(
                        spark, base / ("input" if name == "restore" else "cold-input"), work / "out",
                        bench_scale._conf(bench_scale._root(args.store, work, s3, "root"), work, restore, 3,
                                          endpoint))
                    print(f"\n==== {name} round {attempt}: {took:.3f} s; S3 requests "
                          f"{sum(timeline.requests.values())} "
                          f"{dict(timeline.requests)}")
                    for at, thread, what in timeline.events:
                        print(f"{at:7.3f}  {thread[:24]:24}  {what}")
                    shutil.rmtree(work, ignore_errors=True)
        finally:
            spark.stop()
            if s3cm is not None:
                s3cm.__exit__(None, None, None)


if __name__ == "__main__":
    main()
