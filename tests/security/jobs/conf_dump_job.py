"""Security job: a small Sparkpoint run that also dumps what the driver can see of its
configuration (Spark conf, argv) and a digest of the S3 secret in its environment.

    spark-submit ... conf_dump_job.py --input DIR --output DIR --dump FILE
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def main() -> None:
    from airflow_sparkpoint.checkpoints.run_result import result_line
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DirectorySink

    job = SparkpointJob.get_or_create(app_name="security-conf-dump")
    spark = job.spark
    dump = {
        "spark_conf": sorted(spark.sparkContext.getConf().getAll()),
        "sql_conf": sorted(spark.conf.getAll.items()),
        "argv": sys.argv,
        "secret_sha256": hashlib.sha256(os.environ.get("AWS_SECRET_ACCESS_KEY", "").encode()).hexdigest(),
    }
    with open(job.arg("dump"), "w", encoding="utf-8") as handle:
        json.dump(dump, handle)
    events = spark.readStream.schema("id long, user string").option("maxFilesPerTrigger", 1).json(job.arg("input"))
    result = job.run(events, sink=DirectorySink(job.arg("output"), format="json"), output_mode="append")
    print(result_line(result), flush=True)


if __name__ == "__main__":
    main()
