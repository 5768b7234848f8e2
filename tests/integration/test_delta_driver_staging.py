"""Which side stages a DeltaSink batch: the driver when Spark knows the batch is small,
the executors otherwise, and the executors again when a batch turns out too large to
collect (``spark.driver.maxResultSize``) — with the output still exact."""

from __future__ import annotations

import subprocess
import textwrap
from collections import Counter

import pytest

from airflow_sparkpoint.sinks._delta_stage import estimated_bytes, stage_on_driver
from tests.support.inputs import write_json_batches
from tests.support.submit import spark_submit_command, submit_env

pytestmark = pytest.mark.spark


def test_only_batches_spark_can_size_within_the_limit_are_staged_from_the_driver(spark, tmp_path):
    import pyarrow as pa

    local = spark.createDataFrame(pa.table({"k": ["a", "b"], "v": [1, 2]}))  # a local relation: sized
    size = estimated_bytes(local)
    assert size is not None and 0 < size < 1024
    assert stage_on_driver(local, size) and not stage_on_driver(local, size - 1)
    assert not stage_on_driver(local, 0), "0 means always the executors"

    (tmp_path / "f").mkdir()
    local.write.mode("overwrite").parquet(str(tmp_path / "f"))
    files = spark.read.parquet(str(tmp_path / "f"))
    assert estimated_bytes(files) == sum(p.stat().st_size for p in (tmp_path / "f").glob("*.parquet"))

    rdd_backed = spark.createDataFrame([("a", 1)], "k string, v long")  # an RDD: Spark has no size
    assert estimated_bytes(rdd_backed) is None
    assert not stage_on_driver(rdd_backed, 2**62)


JOB = textwrap.dedent("""
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    if __name__ == "__main__":
        job = SparkpointJob.get_or_create(app_name="driver-staging-fallback")
        events = (job.spark.readStream.schema("user string, amount long")
                  .option("maxFilesPerTrigger", 1).json(job.arg("input")))
        totals = events.groupBy("user").agg(F.sum("amount").alias("total"))
        # explode() multiplies the rows but not Spark's size estimate: the batch looks
        # small enough for the driver and is not.
        wide = totals.withColumn("copy", F.explode(F.sequence(F.lit(1), F.lit(int(job.arg("fanout"))))))
        result = job.run(wide, sink=DeltaSink(job.arg("output")), output_mode="update")
        print("SPARKPOINT_RESULT " + str(result.status) + " " + str(result.committed_batches), flush=True)
""")


def test_a_batch_too_large_to_collect_is_staged_by_the_executors_exactly_once(tmp_path):
    from deltalake import DeltaTable

    fanout = 100_000  # 3 users x 100,000 rows: several MiB of Arrow, over a 1 MiB maxResultSize
    inputs = tmp_path / "input"
    batches = [[("a", 1), ("b", 2), ("c", 3)], [("a", 10), ("b", 20)]]
    write_json_batches(inputs, [[{"user": u, "amount": a} for u, a in rows] for rows in batches],
                       name="part-{}.json")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    output = tmp_path / "table"
    env = submit_env()
    command = spark_submit_command(script, {
        "spark.driver.maxResultSize": "1m",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.sparkpoint.dir": str(tmp_path / "checkpoints"),
        "spark.sparkpoint.job": "fallback",
    }, ["--input", str(inputs), "--output", str(output), "--fanout", str(fanout)], env=env)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "SPARKPOINT_RESULT finished (0, 1)" in done.stdout, log[-4000:]
    # Batch 0 was tried on the driver, refused by maxResultSize and staged by the executors;
    # batch 1 went straight to the executors (the sink remembers).
    assert log.count("too large to stage from the driver") == 1, log[-4000:]
    assert "maxResultSize" in log
    assert "threw an exception" not in log, log[-4000:]  # no callback into Python raced the exit

    table = DeltaTable(str(output))
    assert [h.get("sparkpoint.batch") for h in table.history() if "sparkpoint.batch" in h] == ["1", "0"]
    data = table.to_pyarrow_table(columns=["user", "total"]).to_pylist()
    # Every (user, running total) row of each batch exactly `fanout` times: the retried
    # collect neither duplicated rows nor applied batch 0 to the state twice.
    assert Counter((r["user"], r["total"]) for r in data) == {
        ("a", 1): fanout, ("b", 2): fanout, ("c", 3): fanout, ("a", 11): fanout, ("b", 22): fanout,
    }
