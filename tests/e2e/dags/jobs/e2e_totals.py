"""The end-to-end tests' PySpark job: per-user running totals of JSON events merged into
a Delta table (``user``, ``total``, ``events``), one input file per micro-batch.

Test hooks (for the fault tests of ``tests/e2e``; inert unless given):

- ``spark.sparkpoint.test.pauseAt=stage:<batch>`` (the runtime's own ``stage`` pause
  point, ``airflow_sparkpoint.faults.pause``) pauses the driver as that batch is about to
  be staged in the sink: nothing of it is written or recorded yet.
- ``--executor-pause-dir=<dir>``: the executor task that reads a row of user
  ``MARKER`` creates ``<dir>/executor.reached`` (its pid) and waits for
  ``<dir>/executor.release`` — once: a retry of that task (on another executor, after
  the first one's machine was killed) finds the marker and goes on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

MARKER = "pause-here"


def pause_on_marker(pause_dir: str) -> Any:
    def run(frames: Iterator[Any]) -> Iterator[Any]:
        for frame in frames:
            if (frame["user"] == MARKER).any():
                os.makedirs(pause_dir, exist_ok=True)
                reached = os.path.join(pause_dir, "executor.reached")
                try:  # the claim is never removed: only the first attempt of the task pauses
                    fd = os.open(os.path.join(pause_dir, "executor.claimed"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    fd = -1
                if fd >= 0:
                    os.close(fd)
                    with open(reached + ".tmp", "w") as handle:
                        handle.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
                    os.rename(reached + ".tmp", reached)
                    release = os.path.join(pause_dir, "executor.release")
                    deadline = time.monotonic() + 600
                    while not os.path.exists(release) and time.monotonic() < deadline:
                        time.sleep(0.1)
            yield frame

    return run


def main() -> None:
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(totals, app_name="sparkpoint-e2e-totals")  # prints the result line, then exits


def totals(job: Any) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink

    events = (
        job.spark.readStream.schema("user string, amount long")
        .option("maxFilesPerTrigger", int(job.arg("files-per-batch", "1")))
        .json(job.arg("input"))
    )
    pause_dir = job.arg("executor-pause-dir", "")
    if pause_dir:
        events = events.mapInPandas(pause_on_marker(pause_dir), events.schema)
    per_user = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    job.run(per_user, sink=DeltaSink(job.arg("output"), mode="merge", keys=["user"]),
            output_mode="update")


if __name__ == "__main__":
    main()
