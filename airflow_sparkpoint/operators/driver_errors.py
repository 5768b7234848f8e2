"""The driver's own error as the submit task's exception (issue #48): which error and its
words are `services.driver_errors`' (`DriverOutput`, `driver_error`, `failure`); here the
exception Airflow gets: `SparkpointRunFailed`, or `SparkpointConfigFailure` (not retried)
for a driver's `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.operators.submit_checks import SparkpointConfigFailure
from airflow_sparkpoint.services.driver_errors import DriverError, DriverOutput, driver_error, failure
from airflow_sparkpoint.services.stores import Catalog

__all__ = ["DriverError", "DriverOutput", "SparkpointRunFailed", "failure", "run_failure"]


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
