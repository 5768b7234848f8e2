"""The driver's own error as the submit task's exception (issue #48): which error and its
words are `services.driver_errors`' (`DriverOutput`, `driver_error`, `failure`); here the
exception Airflow gets: `SparkpointRunFailed`, or `SparkpointConfigFailure` (not retried)
for a driver's `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.operators.submit_checks import SparkpointConfigFailure
from airflow_sparkpoint.operators.submit_hook import SparkpointSubmitHook
from airflow_sparkpoint.services.driver_errors import DriverError, DriverOutput, driver_error, failure
from airflow_sparkpoint.services.stores import Catalog

__all__ = ["DriverError", "DriverOutput", "FailedSubmit", "SparkpointRunFailed", "failure", "run_failure",
           "submit_failure"]


class SparkpointRunFailed(AirflowException, SparkpointError):
    """The submitted run failed; the message starts with the run's own error
    (``job '<name>' failed: <Class>: <message>``), `error` holds it."""

    def __init__(self, message: str, error: DriverError | None = None) -> None:
        super().__init__(message)
        self.error = error


def run_failure(job: str, catalog: Catalog, token: str, after: int, *, output: DriverOutput | None,
                exit_code: int | None, scrub: Callable[[str], str]) -> AirflowException | None:
    """The task's exception for the failed run of submit `token`
    (`services.driver_errors.driver_error`: its driver's error line, else its status
    record's error, else its last traceback), None when none says anything. A driver's
    `ConfigError` is not retried (`SparkpointConfigFailure`); the message is `scrub`bed
    of the connection's secrets."""
    error = driver_error(catalog, token, after, output=output, scrub=scrub)
    if error is None:
        return None
    message = failure(job, error, exit_code=exit_code)
    if error.type == "ConfigError":
        return SparkpointConfigFailure(message)
    return SparkpointRunFailed(message, error)


class FailedSubmit(Protocol):
    """What `submit_failure` reads of the submit operator."""

    job_name: str
    _hook: Any  # the Spark provider's: a `SparkpointSubmitHook` once spark-submit ran here

    @property
    def sparkpoint_hook(self) -> Any: ...


def submit_failure(op: FailedSubmit, catalog: Catalog, token: str, after: int) -> AirflowException | None:
    """`run_failure` of the submit task `op`'s run: with what its spark-submit printed and
    its exit code when spark-submit ran under this task (client mode, attached), scrubbed
    of its connection's secrets."""
    hook = op._hook if isinstance(op._hook, SparkpointSubmitHook) else None
    return run_failure(op.job_name, catalog, token, after, output=hook.driver_output if hook else None,
                       exit_code=getattr(getattr(hook, "_submit_sp", None), "returncode", None),
                       scrub=op.sparkpoint_hook.scrub)
