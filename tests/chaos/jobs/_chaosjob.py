"""What every chaos job shares (imported by the job scripts next to it).

* ``--input DIR --output URI``: events (``id long, user string, amount long``), one JSON
  file per micro-batch (``maxFilesPerTrigger=1``);
* every batch is written as 3 files (so a promotion stopped halfway is really partial);
* ``--pace-after B`` (test pacing, so that a fault armed in the checkpoint of batch B
  fires, or a kill in batch B+1 leaves exactly one transaction record): batch B+1 is
  staged only once a checkpoint of batch B or later is complete and, in ``checkpoint``
  commit mode, every batch up to B is committed. The coordinator checkpoints the newest
  confirmed batch and skips ones that queued up behind a slow checkpoint; without the
  pacing, a checkpoint of B may never be taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

PACE_TIMEOUT_S = 300.0


def pace(job: Any, sink: Any, after: int) -> None:
    """Make `sink` wait, before staging batch ``after + 1``, for a checkpoint of `after`."""
    from airflow_sparkpoint.checkpoints import Catalog

    cfg = job.config
    catalog = Catalog.open(cfg.dir, cfg.job, **cfg.storage_options)
    stage = sink.stage

    def ready() -> bool:
        latest = catalog.latest()
        if latest is None or latest.batch_id < after:
            return False
        return cfg.commit_mode != "checkpoint" or all(r.batch_id > after for r in catalog.transactions())

    def paced_stage(df: Any, ctx: Any) -> Any:
        if ctx.batch_id == after + 1:
            deadline = time.monotonic() + PACE_TIMEOUT_S
            while time.monotonic() < deadline:
                if ready():
                    break
                time.sleep(0.1)
            else:
                logging.getLogger("chaos").warning("pacing: no checkpoint of batch %d after %.0f s", after,
                                                   PACE_TIMEOUT_S)
        return stage(df, ctx)

    sink.stage = paced_stage


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
        after = job.arg("pace-after", "")
        if after:
            pace(job, sink, int(after))
        return job.run(df, sink=sink, output_mode=output_mode)

    SparkpointJob.main(pipeline, app_name=app_name)


def three_files(df: Any) -> Any:
    """Three Spark partitions (round robin: a batch's 3 rows land one in each), so a
    sink writes three files per batch."""
    return df.repartition(3)
