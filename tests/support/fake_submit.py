"""`SparkpointSubmitOperator` without Spark: spark-submit is replaced at the Spark
provider's `subprocess` by a stand-in (`Driver`, the `driver` fixture) that does what a
driver does to the catalog (claim a generation with the token it was given, write a
result, complete a checkpoint); Airflow 3.3's task state store as a fake."""

from __future__ import annotations

import io
import json
import os
import subprocess
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.runtime.config import SUBMITTER_ENV
from airflow_sparkpoint.storage import open_storage
from tests.support.records import checkpoint_at

__all__ = ["JOB", "Driver", "FakeStore", "driver", "operator", "submit_settings"]

JOB = "orders"


class FakeStore:
    """Airflow 3.3's task state store, kept across the tries of one task; records the
    retention each key was set with."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.retention: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        json.dumps(value)  # JSON values only
        self.values[key] = value
        self.retention[key] = retention


class Driver:
    """What `spark-submit` does, seen from the catalog."""

    def __init__(self, root: Path) -> None:
        self.catalog = Catalog(open_storage(str(root)), JOB)
        self.commands: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.behaviour: Callable[[Driver, dict[str, str]], int] = Driver.finish
        self.output = "INFO fake spark-submit\n"  # what spark-submit prints (the driver's output too)

    def claim(self, env: dict[str, str]) -> int:
        return self.catalog.claim_generation({"submitter": env.get(SUBMITTER_ENV), "app": "app-20260101-0001",
                                              "ui": "http://driver-host:4041"}).generation

    def result(self, generation: int, **fields: Any) -> None:
        write_run_result(self.catalog,
                         RunResult(**{"status": "finished", "job": JOB, "generation": generation, **fields}))

    def checkpoint(self, generation: int) -> SnapshotMetadata:
        return checkpoint_at(self.catalog, generation, generation=generation)

    @staticmethod
    def finish(driver: Driver, env: dict[str, str]) -> int:
        driver.result(driver.claim(env), batches_processed=2)
        return 0

    def conf(self, index: int = -1) -> dict[str, str]:
        cmd = self.commands[index]
        return dict(cmd[i + 1].split("=", 1) for i, token in enumerate(cmd) if token == "--conf")


@pytest.fixture()
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Driver:
    """The stand-in `Driver` (its catalog under ``tmp_path/sp``) in place of the Spark
    provider's spark-submit process."""
    from airflow.providers.apache.spark.hooks import spark_submit

    fake = Driver(tmp_path / "sp")

    class Popen:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            env = dict(kwargs.get("env") or os.environ)
            fake.commands.append(list(cmd))
            fake.envs.append(env)
            self.returncode = fake.behaviour(fake, env)
            self.stdout = io.StringIO(fake.output)
            self.pid = os.getpid()

        def wait(self, timeout: float | None = None) -> int:
            return self.returncode

        def poll(self) -> int:
            return self.returncode

    fake_subprocess = types.ModuleType("subprocess")
    fake_subprocess.__dict__.update(vars(subprocess))
    fake_subprocess.Popen = Popen  # type: ignore[attr-defined]
    monkeypatch.setattr(spark_submit, "subprocess", fake_subprocess)
    return fake


def operator(root: Path, **kwargs: Any) -> Any:
    """A `SparkpointSubmitOperator` of job `JOB` with `root` as its checkpoint_dir unless `kwargs`
    name one."""
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    kwargs.setdefault("checkpoint_dir", str(root))
    return SparkpointSubmitOperator(task_id="submit", application="/app/job.py", job_name=JOB, **kwargs)


def submit_settings(root: Path, **overrides: Any) -> Any:
    """`SubmitSettings` of job `JOB`, task ``submit``, with `root` as its store (no S3
    options) and `overrides` (the values of a submit with default parameters otherwise)."""
    from airflow_sparkpoint.services.submit_try import SubmitSettings

    values: dict[str, Any] = {
        "job": JOB, "task": "submit", "storage_uri": str(root), "storage_options": {}, "restore": "latest",
        "restore_snapshot": None, "trigger": "availableNow", "checkpoint_interval": "0", "num_retained": 3,
        "commit_mode": "checkpoint", "work_dir": None, "state_partitions": None, "takeover": False,
        "spark_conf": {}, "extra": {}}
    return SubmitSettings(**{**values, **overrides})
