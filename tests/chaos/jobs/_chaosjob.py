"""What every chaos job shares (imported by the job scripts next to it).

* ``--input DIR --output URI``: events (``id long, user string, amount long``), one JSON
  file per micro-batch (``maxFilesPerTrigger=1``);
* every batch is written as 3 files (so a promotion stopped halfway is really partial);
* the harness paces a batch from outside (so that a fault armed in the checkpoint of
  batch B fires): it holds the driver at the runtime's pause point ``stage`` of batch B+1
  (``spark.sparkpoint.test.pauseAt``), see `tests.chaos.scenarios.pacer`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn


def main(app_name: str, build: Callable[[Any, Any], tuple[Any, Any, str]]) -> NoReturn:
    """Run the query `build(job, events)` returns as ``(df, sink, output_mode)``
    (`SparkpointJob.main`: the result line, then a clean exit)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob

    def pipeline(job: Any) -> Any:
        events = (
            job.spark.readStream.schema("id long, user string, amount long")
            .option("maxFilesPerTrigger", 1)
            .json(job.arg("input"))
        )
        df, sink, output_mode = build(job, events)
        return job.run(df, sink=sink, output_mode=output_mode)

    SparkpointJob.main(pipeline, app_name=app_name)


def three_files(df: Any) -> Any:
    """Three Spark partitions (round robin: a batch's 3 rows land one in each), so a
    sink writes three files per batch."""
    return df.repartition(3)
