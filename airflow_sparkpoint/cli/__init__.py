"""The ``sparkpoint`` command: look at and act on the checkpoints of one job.

::

    sparkpoint list      --dir URI --job NAME [--json]
    sparkpoint status    --dir URI --job NAME [--max-heartbeat-age S] [--json]
    sparkpoint savepoint --dir URI --job NAME [--stop] [--timeout S] [--no-wait] [--no-from-checkpoint]
    sparkpoint dispose   --dir URI --job NAME PATH | [--older-than DURATION] [--keep N]
    sparkpoint requests  list|withdraw ID  --dir URI --job NAME [--reason TEXT]
    sparkpoint commit    --dir URI --job NAME [--upto-batch N | --abort-generation G] [--sink KIND:URI]
    sparkpoint inspect   --dir URI --job NAME PATH|latest [--rows [--operator ID] [--store NAME] [--key JSON]]
    sparkpoint verify    --dir URI --job NAME PATH|latest
    sparkpoint metrics   --dir URI --job NAME [--job NAME ...]
    sparkpoint demo      --workdir DIR

``--dir`` and ``--job`` default to ``$SPARKPOINT_DIR`` and ``$SPARKPOINT_JOB``;
``--s3-endpoint`` / ``--s3-region`` to ``$SPARKPOINT_S3_ENDPOINT`` / ``$SPARKPOINT_S3_REGION``.
S3 credentials come only from the standard AWS environment and config files.

Exit codes: 0 success, 1 operational failure (the store is unreachable, a savepoint
failed or timed out), 2 bad input (a missing or malformed value; the message names it).
The ``--json`` shapes are documented in ``docs/CLI.md`` and are stable.

One module per command group (`history`: list, status, metrics; `savepoint`; `dispose`;
`control`: requests; `commit`; `state`: inspect, verify; `demo`), what they all take in
`options`, what they print in `output`, the parser and the entry point in `main`.
"""

from __future__ import annotations

from airflow_sparkpoint.cli.main import build_parser, main
from airflow_sparkpoint.cli.output import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from airflow_sparkpoint.exceptions import CommandFailed, UsageError

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError", "build_parser", "main"]
