"""The driver's own error, as a submit task reports it (issue #48).

The Spark provider's exception for a failed ``spark-submit`` is only its command and exit
code; what went wrong is in the driver's output above it. `DriverOutput` reads that
output as it passes to the task log (or, for a detached driver, the end of its log file:
`read_log_tail`) and keeps what the driver said about its failure:

1. its error line (`run_result.error_line`: class and message, printed by
   `SparkpointJob.get_or_create`, `job.run` and `SparkpointJob.main` when they fail);
2. else the last Python traceback's exception line (a script's own error).

`driver_error` chooses the run's error (its error line, else the error its status record
holds, else its traceback) and `failure` words the task's message: ``job '<name>' failed:
<Class>: <message>``, then where the log is. The front end raises it. No Airflow, no Spark.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.services.runs import ERROR_LINE, parse_error_line, reported_error

__all__ = ["LOG_TAIL_BYTES", "DriverError", "DriverOutput", "driver_error", "failure", "read_log_tail"]

#: the driver log's last bytes read for its error when a detached driver ends before claiming
LOG_TAIL_BYTES = 256 * 1024

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


def driver_error(catalog: Catalog, token: str, after: int, *, output: DriverOutput | None,
                 scrub: Callable[[str], str]) -> DriverError | None:
    """The error of the failed run of submit `token` (a generation after `after`): its
    driver's error line (in `output`); else the error its status record holds; else
    `output`'s last Python traceback; None when none says anything. The message is
    `scrub`bed of the connection's secrets."""
    recorded = reported_error(catalog, token, after=after)
    error = ((output.reported if output else None) or (DriverError("", recorded) if recorded else None)
             or (output.traceback if output else None))
    if error is None:
        return None
    return DriverError(error.type, scrub(error.message))


def read_log_tail(path: str, max_bytes: int = LOG_TAIL_BYTES) -> list[str]:
    """The last `max_bytes` of a detached driver's log file `path`, as lines.

    :raises OSError: it cannot be read.
    """
    with open(path, "rb") as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - max_bytes))
        return handle.read().decode(errors="replace").splitlines()
