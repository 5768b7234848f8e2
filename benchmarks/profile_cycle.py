"""The storage calls of one checkpoint-and-commit cycle (issue 32, "fixed cost per batch").

Runs a small stateful job (running totals of 500 keys into a local Delta table, one small
file per batch, a checkpoint after every batch, ``numRetained=3``) under ``availableNow``
on local disk and on S3 (moto's server in this process), with the job's store wrapped in
a `CountingStorage`, and prints every call made between the coordinator taking batch N's
progress event and the end of its commit, in order, with the thread that made it: fence
checks (``exists generations/<g+1>``), file copies (``upload_file``/``copy``), listings,
record reads and writes. Calls of the heartbeat and control-poll threads are shown apart
(they run on their own clock, not per batch). Deterministic: counts, not timings.

    .venv/bin/python benchmarks/profile_cycle.py [--batches 8] [--cycle 6] [--stores local,s3]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench import EVENT_SCHEMA, key_name, spark_session, write_parquet_batches


def profile(store: str, batches: int, cycle: int, work: Path) -> list[tuple[int, str, str, str]]:
    """Run the job once; return ``(cycle, thread, operation, key)`` of every call."""
    import airflow_sparkpoint.checkpoints.catalog as catalog_module
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.runtime.committer import Committer
    from airflow_sparkpoint.runtime.run_coordination import RunCoordinator
    from airflow_sparkpoint.sinks import DeltaSink
    from airflow_sparkpoint.storage.counting import CountingStorage

    calls: list[tuple[int, str, str, str]] = []
    current = [-1]

    class Logged(CountingStorage):
        def _note(self, op: str, key: str) -> None:
            calls.append((current[0], threading.current_thread().name, op, key))

    real_init, real_confirm, real_commit = (catalog_module.Catalog.__init__, RunCoordinator.confirm,
                                            Committer.commit_confirmed)

    def init(self: Any, storage: Any, job: str) -> None:
        real_init(self, storage if isinstance(storage, CountingStorage) else Logged(storage), job)

    def confirm(self: Any, batch_id: int) -> None:  # the progress event of batch_id: a cycle starts
        current[0] = batch_id
        real_confirm(self, batch_id)

    def commit(self: Any, checkpoint: Any) -> list[int]:
        done = real_commit(self, checkpoint)
        calls.append((current[0], threading.current_thread().name, "-- committed", ",".join(map(str, done))))
        return done

    catalog_module.Catalog.__init__ = init  # type: ignore[method-assign]
    RunCoordinator.confirm = confirm  # type: ignore[method-assign]
    Committer.commit_confirmed = commit  # type: ignore[method-assign]
    server = None
    try:
        conf = {"spark.sparkpoint.job": "cycle", "spark.sparkpoint.restore": "none",
                "spark.sparkpoint.checkpoint.interval": "0", "spark.sparkpoint.checkpoint.numRetained": "3",
                "spark.sparkpoint.trigger": "availableNow", "spark.sparkpoint.workDir": str(work / "live")}
        if store == "s3":
            import boto3
            from moto.server import ThreadedMotoServer

            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            server.start()
            endpoint = f"http://127.0.0.1:{port}"
            for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"),
                                ("AWS_DEFAULT_REGION", "us-east-1")):
                os.environ.setdefault(name, value)
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="cycle")
            conf.update({"spark.sparkpoint.dir": "s3://cycle/root", "spark.sparkpoint.s3.endpoint": endpoint})
        else:
            conf["spark.sparkpoint.dir"] = str(work / "store")
        write_parquet_batches(work / "input", [[(key_name(i % 500), 1) for i in range(b, b + 200)]
                                               for b in range(batches)])
        spark = spark_session("sparkpoint-cycle")
        events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger",
                                                              1).parquet(str(work / "input"))
        from pyspark.sql import functions as F

        job = SparkpointJob.get_or_create(conf=conf, argv=[])
        result = job.run(events.groupBy("user").agg(F.sum("amount").alias("total")),
                         sink=DeltaSink(str(work / "table"), mode="merge", keys=["user"]),
                         output_mode="update")
        assert result.status == "finished", result
    finally:
        catalog_module.Catalog.__init__ = real_init  # type: ignore[method-assign]
        RunCoordinator.confirm = real_confirm  # type: ignore[method-assign]
        Committer.commit_confirmed = real_commit  # type: ignore[method-assign]
        if server is not None:
            server.stop()
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--cycle", type=int, default=6, help="the batch whose cycle is listed")
    parser.add_argument("--stores", default="local,s3")
    args = parser.parse_args(argv)
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix="sparkpoint-cycle-") as tmp:
            calls = profile(store, args.batches, args.cycle, Path(tmp))
        mine = [c for c in calls if c[0] == args.cycle]
        cycle = [c for c in mine if c[1] != "sparkpoint-heartbeat"]
        print(f"\n== {store}: the cycle of batch {args.cycle} (progress event -> commit), coordinator and "
              "transfer threads")
        for _, thread, op, key in cycle:
            print(f"  {thread[:22]:22} {op:14} {key}")
        from airflow_sparkpoint.storage.counting import KIND_OF

        kinds = Counter(KIND_OF[op] for _, _, op, _ in cycle if op in KIND_OF)
        print(f"  total {sum(kinds.values())}: {dict(sorted(kinds.items()))}")
        others = Counter((t, op) for _, t, op, _ in mine if t == "sparkpoint-heartbeat")
        if others:
            print(f"  meanwhile on the heartbeat thread: {dict(others)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
