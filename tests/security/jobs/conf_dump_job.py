"""Security job: a small Sparkpoint run that also dumps what the driver can see of its
configuration (Spark conf, argv) and a digest of the S3 secret in its environment.

    spark-submit ... conf_dump_job.py --input DIR --output DIR --dump FILE
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any


def main() -> None:
    from airflow_sparkpoint.runtime import SparkpointJob

    SparkpointJob.main(conf_dump, app_name="security-conf-dump")  # prints the result line, then exits


def conf_dump(job: Any) -> None:
    from airflow_sparkpoint.sinks import DirectorySink

    spark = job.spark
    dump = {
        "spark_conf": sorted(spark.sparkContext.getConf().getAll()),
        "sql_conf": sorted(spark.conf.getAll.items()),
        "argv": sys.argv,
        "secret_sha256": hashlib.sha256(os.environ.get("AWS_SECRET_ACCESS_KEY", "").encode()).hexdigest(),
    }
    with open(job.arg("dump"), "w", encoding="utf-8") as handle:
        json.dump(dump, handle)
    events = (spark.readStream.schema("id long, user string").option("maxFilesPerTrigger", 1)
              .json(job.arg("input")))
    job.run(events, sink=DirectorySink(job.arg("output"), format="json"), output_mode="append")


if __name__ == "__main__":
    main()
