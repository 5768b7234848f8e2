"""Race-test job: de-duplicated events appended to a Delta table (DeltaSink mode=append).

``dropDuplicates`` keeps state, so a restart must restore it; every input id must land
exactly once. ``--max-files 0`` lets one micro-batch take every file available (so two
runs that plan from different restart points build different batches).

    spark-submit ... append_job.py --input DIR --output TABLE [--max-files N]
"""

from __future__ import annotations

import logging


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.checkpoints.run_result import result_line
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(app_name="race-append")
    reader = job.spark.readStream.schema("id long, user string, amount long")
    max_files = int(job.arg("max-files", "1"))
    if max_files > 0:
        reader = reader.option("maxFilesPerTrigger", max_files)
    events = reader.json(job.arg("input"))
    result = job.run(events.dropDuplicates(["id"]), sink=DeltaSink(job.arg("output"), mode="append"),
                     output_mode="append")
    print(result_line(result), flush=True)


if __name__ == "__main__":
    main()
