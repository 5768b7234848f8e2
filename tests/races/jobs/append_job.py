"""Race-test job: de-duplicated events appended to a Delta table (DeltaSink mode=append).

``dropDuplicates`` keeps state, so a restart must restore it; every input id must land
exactly once. ``--max-files 0`` lets one micro-batch take every file available (so two
runs that plan from different restart points build different batches).

    spark-submit ... append_job.py --input DIR --output TABLE [--max-files N]
"""

from __future__ import annotations

import logging
from typing import Any


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(append, app_name="race-append")  # prints the result line, then exits


def append(job: Any) -> None:
    from airflow_sparkpoint.sinks import DeltaSink

    reader = job.spark.readStream.schema("id long, user string, amount long")
    max_files = int(job.arg("max-files", "1"))
    if max_files > 0:
        reader = reader.option("maxFilesPerTrigger", max_files)
    events = reader.json(job.arg("input"))
    job.run(events.dropDuplicates(["id"]), sink=DeltaSink(job.arg("output"), mode="append"),
            output_mode="append")


if __name__ == "__main__":
    main()
