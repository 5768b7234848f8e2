"""The job of the sink race tests: events into one of the sinks, chosen by ``--sink``.

    spark-submit sink_job.py --sink s3|directory|delta-append|delta-merge --input DIR --output URI
                             [--source files|partitioned] [--max-files N]

The events come from JSON files, one per micro-batch (``--max-files N``: N), or with ``--source partitioned``
from the partition files of topic ``events`` under DIR, read by a Python data source with
Kafka's offset shape (`tests.races.partitioned_source`, at most two records per partition
and batch).

``delta-merge`` keeps running totals per user (``user``, ``total``, ``events``) merged by
``user``; the other sinks append every event (``id``, ``user``, ``amount``), spread over
three Spark partitions so that a batch is several files.
"""

from __future__ import annotations

import logging
from typing import Any


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_sparkpoint").setLevel(logging.INFO)
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(sink_race, app_name="sink-race")  # prints the result line, then exits


def sink_race(job: Any) -> None:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.sinks import DeltaSink, DirectorySink, S3Sink

    kind, output = job.arg("sink"), job.arg("output")
    if job.arg("source", "files") == "partitioned":
        from tests.races.partitioned_source import TOPIC, PartitionedSource

        job.spark.dataSource.register(PartitionedSource)
        events = (job.spark.readStream.format(PartitionedSource.name()).option("path", job.arg("input"))
                  .option("topic", TOPIC).option("maxPerPartition", "2").load())
    else:
        events = (
            job.spark.readStream.schema("id long, user string, amount long")
            .option("maxFilesPerTrigger", int(job.arg("max-files", "1")))
            .json(job.arg("input"))
        )
    if kind == "delta-merge":
        totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
        job.run(totals, sink=DeltaSink(output, mode="merge", keys=["user"]), output_mode="update")
    else:
        sinks = {"delta-append": lambda: DeltaSink(output), "s3": lambda: S3Sink(output, format="json"),
                 "directory": lambda: DirectorySink(output, format="json")}
        job.run(events.repartition(3), sink=sinks[kind](), output_mode="append")


if __name__ == "__main__":
    main()
