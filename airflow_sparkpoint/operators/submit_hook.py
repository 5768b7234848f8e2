"""The Spark provider's hook as `SparkpointSubmitOperator` runs it: credentials (and the
submit token) reach spark-submit's environment only, and the driver's output is read for
its own error as it passes to the task log (`driver_errors.DriverOutput`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_sparkpoint.operators.driver_errors import DriverOutput


class SparkpointSubmitHook(SparkSubmitHook):
    """A SparkSubmitHook that passes `secret_env` to spark-submit's environment only:
    never on the command line (which is logged) and never in templated fields; and keeps
    what the driver said about a failure (`driver_output`)."""

    def __init__(self, *args: Any, secret_env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._secret_env = dict(secret_env or {})
        self.driver_output = DriverOutput()

    @classmethod
    def of(cls, base: SparkSubmitHook, secret_env: Mapping[str, str]) -> SparkpointSubmitHook:
        """`base` (the hook the Spark operator built) as this class."""
        hook = cls.__new__(cls)
        hook.__dict__.update(base.__dict__)
        hook._secret_env = dict(secret_env)
        hook.driver_output = DriverOutput()
        return hook

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command = super()._build_spark_submit_command(application)
        if self._secret_env:
            self._env = {**(self._env or {}), **self._secret_env}
        return command

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self.driver_output.watch(itr))
