"""The Spark provider's hook as `SparkpointSubmitOperator` runs it: credentials (and the
submit token) reach spark-submit's environment only, and the driver's output is read for
its own error as it passes to the task log (`services.driver_errors.DriverOutput`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_sparkpoint.services.driver_errors import DriverOutput

__all__ = ["SPARK_CONNECTION_KEYS", "SPARK_PROVIDER_PRIVATE_NAMES", "SparkpointSubmitHook"]

#: Private names of the Spark provider the submit operator relies on (present in 6.0
#: through 6.3; pyproject.toml bounds the provider below 7, and a test checks them on the
#: installed one): (class, attribute); ``_connection`` keys are checked as well.
SPARK_PROVIDER_PRIVATE_NAMES = (
    (SparkSubmitOperator, "_get_hook"), (SparkSubmitOperator, "_hook"), (SparkSubmitOperator, "_conn_id"),
    (SparkSubmitHook, "_connection"), (SparkSubmitHook, "_env"), (SparkSubmitHook, "_submit_sp"),
    (SparkSubmitHook, "_build_spark_submit_command"), (SparkSubmitHook, "_process_spark_submit_log"),
    # cluster mode (`operators.submit_cluster`, `hooks.spark_cluster`)
    (SparkSubmitHook, "_mask_cmd"), (SparkSubmitHook, "_get_yarn_rm_base_url"),
    (SparkSubmitHook, "_resolved_yarn_rm_auth"), (SparkSubmitHook, "_YARN_RM_WEBAPP_ADDRESS_EXTRA_KEY"),
)
SPARK_CONNECTION_KEYS = ("master", "deploy_mode", "namespace")


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
