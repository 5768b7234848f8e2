"""Green takes blue's job over at the agreed batch N and goes on from N+1 with the state
it built in its shadow (`runtime.follow`, `runtime.job._Run` with ``adopted``), with real
drivers: blue (its own ``spark-submit``, ``jobs/shadow_totals.py``, Delta append) drains
files 0..3 (batches 0..3) and exits: its final checkpoint X is at N = 3. Green, in this
process, with code that counts every amount twice, follows blue from an older checkpoint
K, stops at N, claims blue's job (the cutover's handover; here a test double of
wt-cutover's ``runtime.cutover.adopt``: claim exactly blue's generation + 1, an origin
whose base is X and whose live location is green's), takes an adoption checkpoint of its
own state at N and runs batches 4 and 5 into blue's table.

Oracle (plain Python from the input): each batch committed once (0..3 by blue, 4..5 by
green); green's rows of batches 4 and 5 are blue's totals through K plus green's doubled
amounts after K: the state green built in its shadow, not blue's state X.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.follow_record import FollowProgress
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.demo.support import SubmittedJob, delta_history, write_batch_file
from tests.support.shadow_totals import FILES, JOB_SCRIPT, batch_rows, green_totals, job_module, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a blue spark-submit, about a minute


class Handover:
    """The cutover as green sees it: N agreed, blue stopped there; `adopt` as wt-cutover's
    `runtime.cutover.adopt` does it (claim, then origin), without its records."""

    def __init__(self, catalog: Catalog, n: int, blue_generation: int) -> None:
        self.catalog, self.n, self.blue_generation = catalog, n, blue_generation
        self.reports: list[int] = []
        self.adopted: tuple[str, str | None] | None = None

    def report(self, progress: FollowProgress, shadow_generation: int) -> None:
        self.reports.append(progress.last_replayed)

    def agreed_batch(self) -> int | None:
        return self.n

    def blue_stopped(self) -> bool:
        return True

    def adopt(self, live_dir: str, adopted_from: str | None) -> int:
        final = self.catalog.latest()
        assert final is not None and final.batch_id == self.n
        uri = self.catalog.handle(final).uri
        claim = self.catalog.claim_generation_after(self.blue_generation, {"restore": f"adopt:{uri}"})
        assert claim is not None
        self.catalog.write_origin(new_origin(
            claim.generation, kind="checkpoint", uri=uri, base_id=final.id, snapshot_id=final.id,
            batch_id=self.n, id_floor=self.catalog.next_checkpoint_id() - 1,
            restore={"restore": uri, "sink_ahead": "fail", "force": False, "allow_foreign_job": False,
                     "adopted_from": adopted_from}, live_dir=live_dir, host=socket.gethostname(),
            pid=os.getpid()))
        self.adopted = (live_dir, adopted_from)
        return claim.generation


def test_green_takes_over_at_n_and_goes_on_with_the_state_it_built_in_its_shadow(
        spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob

    blue = SubmittedJob(tmp_path / "blue", JOB_SCRIPT, "totals", "availableNow", ["--sink", "delta"])
    for index in range(4):
        write_batch_file(blue.input, index, rows_of(index, FILES[index]))
    blue.start()
    try:
        assert blue.wait_exit(timeout=300) == 0, blue.tail()
    finally:
        blue.kill()
    catalog = blue.catalog
    blue_generation = catalog.current_generation()
    oldest = min(catalog.checkpoints(), key=lambda m: m.batch_id)
    k = oldest.batch_id
    assert k < 3
    for index in (4, 5):  # the input of green's first batches as the production job
        write_batch_file(blue.input, index, rows_of(index, FILES[index]))

    script = job_module()
    green = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": str(blue.root), "spark.sparkpoint.job": "totals",
        "spark.sparkpoint.shadow.mode": "discard", "spark.sparkpoint.shadow.dir": str(tmp_path / "shadow"),
        "spark.sparkpoint.shadow.from": catalog.handle(oldest).uri,
        "spark.sparkpoint.shadow.pollInterval": "0.3s",
    }, argv=["--input", str(blue.input), "--output", str(blue.output), "--sink", "delta"])
    handover = Handover(catalog, 3, blue_generation)
    green.handover = handover
    doubled = green.spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1).json(
        str(blue.input)).withColumn("amount", F.col("amount") * 2)
    query = doubled.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = green.run(query, sink=script.sink_of(green), output_mode="update")

    assert (result.status, result.job, result.generation) == ("finished", "totals", blue_generation + 1), \
        result
    assert (result.first_batch, result.last_batch) == (4, 5), result
    assert result.live_reuse["mode"] == "adopted" and handover.adopted is not None
    assert result.live_dir == handover.adopted[0]
    assert handover.reports and max(handover.reports) == 3

    # Every batch committed once: 0..3 by blue, 4..5 by green.
    commits = [c for c in delta_history(blue.output) if c["batch"] is not None]
    by_batch = sorted((c["batch"], c["generation"]) for c in commits)
    assert by_batch == [(b, blue_generation) for b in range(4)] + [(4, blue_generation + 1),
                                                                     (5, blue_generation + 1)], by_batch
    # Green's rows: its shadow's state (doubled after K), not blue's X.
    rows = batch_rows(blue.output, [c for c in commits if c["batch"] >= 4])
    expected = green_totals(FILES, k)
    assert rows == {4: expected[4], 5: expected[5]}, (rows, expected)
    # The adoption checkpoint: green's state at N in blue's catalog, by green's generation.
    mine = [m for m in catalog.checkpoints() if m.generation == blue_generation + 1]
    assert min(m.batch_id for m in mine) == 3 and catalog.latest().batch_id == 5  # type: ignore[union-attr]

