"""The rescale-on-restore tests' pipeline, input, oracle and drivers, shared by
``tests/integration/test_rescale.py`` (local storage) and ``test_state_s3.py`` (S3).

Per-user running totals (``tests/integration/jobs/rescale_job.py``) over one input file
per micro-batch; `expected` is the oracle, computed from the input in plain Python. The
first run of a job goes through the test session's Spark (`first_run`: saves a JVM
start); every restore under test runs in its own ``spark-submit`` (`submit`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint import cli
from airflow_sparkpoint.checkpoints.run_result import parse_result_line
from airflow_sparkpoint.demo.support import write_batch_file
from tests.support.inputs import delta_totals, expected_totals
from tests.support.paths import REPO, load_module
from tests.support.submit import spark_submit_command, submit_env

JOB_SCRIPT = REPO / "tests" / "integration" / "jobs" / "rescale_job.py"
JOB = "rescale"
USERS = 7
SPARK_CONF = {"spark.ui.enabled": "false", "spark.log.level": "WARN"}


def rows(index: int) -> list[dict[str, Any]]:
    return [{"user": f"u{u}", "amount": index * 100 + u * 7 + 1} for u in range(USERS) if (index + u) % 5]


def expected(files: int) -> dict[str, tuple[int, int]]:
    return expected_totals(row for index in range(files) for row in rows(index))


def write_inputs(directory: Path, start: int, stop: int) -> None:
    """Input files `start` .. `stop` - 1 (one micro-batch each)."""
    for index in range(start, stop):
        write_batch_file(directory, index, rows(index))


table = delta_totals  # the job's output table, in the oracle's shape


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        self.output = proc.stdout
        result = parse_result_line(proc.stdout)
        self.result: dict[str, Any] | None = None if result is None else result.to_json()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])


def submit(base: Path, pipeline: str, conf: dict[str, str], env: dict[str, str] | None = None,
           inputs: Path | None = None) -> Run:
    """`pipeline` in its own ``spark-submit`` (local[2]): job root ``base/sp`` unless `conf`
    names another ``spark.sparkpoint.dir``, output table ``base/out``."""
    environment = submit_env(env)
    settings = {**SPARK_CONF, "spark.sparkpoint.dir": str(base / "sp"), "spark.sparkpoint.job": JOB, **conf}
    cmd = spark_submit_command(JOB_SCRIPT, settings,
                               ["--pipeline", pipeline, "--input", str(inputs or base / "input"),
                                "--output", str(base / "out")], env=environment)
    proc = subprocess.run(cmd, check=False, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=900)
    return Run(proc)


def finished(run: Run) -> dict[str, Any]:
    assert run.returncode == 0 and run.result is not None, run.tail()
    assert run.result["status"] == "finished", run.result
    return run.result


def offsets_conf(live_dir: str, batch: int) -> dict[str, str]:
    """The SQL conf Spark recorded with batch `batch` in its offset log."""
    lines = Path(live_dir, "offsets", str(batch)).read_text().splitlines()
    return dict(json.loads(lines[1])["conf"])


def list_json(capsys: pytest.CaptureFixture[str], root: str, *options: str) -> dict[str, Any]:
    """``sparkpoint list --json`` of the job under `root` (`options`: e.g. the S3 flags)."""
    code = cli.main(["list", "--dir", root, "--job", JOB, *options, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def job_module() -> Any:
    return load_module("sparkpoint_rescale_job", JOB_SCRIPT)


def run_in_process(spark: Any, base: Path, pipeline: str, conf: dict[str, str]) -> Any:
    """`pipeline` through `SparkpointJob` in the test session's Spark (root ``base/sp``
    unless `conf` names another), output table ``base/out``."""
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={"spark.sparkpoint.dir": str(base / "sp"),
                                            "spark.sparkpoint.job": JOB, **conf}, argv=[])
    df, sink_args, mode = job_module().build(spark, pipeline, str(base / "input"))
    return job.run(df, sink=DeltaSink(str(base / "out"), **sink_args), output_mode=mode)


def first_run(spark: Any, base: Path, pipeline: str, files: int, partitions: int,
              conf: dict[str, str] | None = None) -> Any:
    """Input files 0 .. `files` - 1 through `pipeline` with `partitions` state partitions,
    in the test session's Spark (whose shuffle partitions are given back afterwards:
    other tests share the session). Asserts it finished with the exact totals."""
    write_inputs(base / "input", 0, files)
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        result = run_in_process(spark, base, pipeline, {"spark.sparkpoint.restore": "latest",
                                                        "spark.sql.shuffle.partitions": str(partitions),
                                                        **(conf or {})})
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
    assert result.status == "finished" and result.last_batch == files - 1
    assert table(base / "out") == expected(files)
    return result
