"""The driver's own error as the submit task's error (issue #48).

The Spark provider's exception for a failed ``spark-submit`` is only its command and exit
code; what went wrong is in the driver's output above it. `DriverOutput` reads that
output as it passes to the task log and keeps what the driver said about its failure:

1. its error line (`run_result.error_line`: class and message, printed by
   `SparkpointJob.get_or_create`, `job.run` and `SparkpointJob.main` when they fail);
2. else the last Python traceback's exception line (a script's own error).

`failure` turns it, or the error the run recorded in its status record, into the task's
exception: ``job '<name>' failed: <Class>: <message>``, then where the log is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.operators.submit_checks import SparkpointConfigFailure
from airflow_sparkpoint.services.runs import ERROR_LINE, parse_error_line, reported_error
from airflow_sparkpoint.services.stores import Catalog

__all__ = ["DriverError", "DriverOutput", "SparkpointRunFailed", "failure", "run_failure"]

_TRACEBACK = "Traceback (most recent call last):"
#: the exception line that ends a Python traceback: ``module.Class: message`` or ``Class``
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
#: a longer line is not parsed (nothing a driver prints about its error is that long)
_MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class DriverError:
    """A run's own error: its class name (empty when unknown) and message."""

    type: str
    message: str

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.type else self.message


class SparkpointRunFailed(AirflowException, SparkpointError):
    """The submitted run failed; the message starts with the run's own error
    (``job '<name>' failed: <Class>: <message>``), `error` holds it."""

    def __init__(self, message: str, error: DriverError | None = None) -> None:
        super().__init__(message)
        self.error = error


class DriverOutput:
    """What the driver said about its failure, read from spark-submit's output lines as
    they pass (`watch`); `error` is the newest (see the module docstring)."""

    def __init__(self) -> None:
        self.reported: DriverError | None = None
        self.traceback: DriverError | None = None
        self._in_traceback = False

    def watch(self, lines: Iterable[str]) -> Iterator[str]:
        for line in lines:
            self._see(line)
            yield line

    @property
    def error(self) -> DriverError | None:
        return self.reported or self.traceback

    def _see(self, raw: str) -> None:
        line = raw.rstrip("\r\n")
        if len(line) > _MAX_LINE:
            return
        if line.startswith(ERROR_LINE):
            parsed = parse_error_line(line)
            if parsed is not None:
                self.reported = DriverError(*parsed)
            return
        if line.startswith(_TRACEBACK):
            self._in_traceback = True
            return
        if self._in_traceback and line and not line[0].isspace():
            self._in_traceback = False
            match = _EXCEPTION_LINE.match(line)
            if match:
                self.traceback = DriverError(match.group(1).rpartition(".")[2], match.group(2) or "")


def failure(job: str, error: DriverError, *, exit_code: int | None) -> str:
    """The message of a failed run's task exception: the run's error first, then where
    its log is."""
    code = "" if exit_code is None else f" with code {exit_code}"
    return (f"job {job!r} failed: {error}\n(spark-submit exited{code}; the driver's "
            "output is in this task's log "
            "above)")


def run_failure(job: str, catalog: Catalog, token: str, after: int, *, output: DriverOutput | None,
                exit_code: int | None, scrub: Callable[[str], str]) -> AirflowException | None:
    """The task's exception for the failed run of submit `token`: its driver's error line
    (in `output`); else the error its status record holds; else `output`'s last Python
    traceback; None when none says anything. A driver's `ConfigError` is not retried
    (`SparkpointConfigFailure`); the message is `scrub`bed of the connection's secrets."""
    recorded = reported_error(catalog, token, after=after)
    error = ((output.reported if output else None) or (DriverError("", recorded) if recorded else None)
             or (output.traceback if output else None))
    if error is None:
        return None
    error = DriverError(error.type, scrub(error.message))
    message = failure(job, error, exit_code=exit_code)
    if error.type == "ConfigError":
        return SparkpointConfigFailure(message)
    return SparkpointRunFailed(message, error)
